"""The sweep: five ways to run one sampling step, side by side, on the same GPUs in one run.

Per batch size, vocabulary and logits dtype it measures (greedy, every rank, tp = all GPUs):
  eager_shard      the seed's eager batch sharder (host plan, per-step allocations, uneven a2a)
  eager_allgather  eager all-gather of the vocab shards + sample every row
  graph_allgather  the same all-gather + sample captured in one graph (graphshard, replicate)
  graphshard_nccl  graphshard shard strategy over padded NCCL all-to-all, one graph
  graphshard_p2p   graphshard shard strategy over symmetric-memory pushes, one graph
Step latency includes the host read of the sampled ids (median, p90); host issue time is the
time to return from the step call; bytes are the logits bytes this rank sends over the link.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from graphshard.baselines import EagerAllGather, EagerBatchShard
from graphshard.config import Config
from graphshard.engine import DTYPES, Engine
from graphshard.params import SamplingParams

PATHS = ("eager_shard", "eager_allgather", "graph_allgather", "graphshard_nccl", "graphshard_p2p")
BASELINES = ("eager_shard", "eager_allgather", "graph_allgather")


@dataclass(frozen=True)
class SweepSettings:
    batches: tuple[int, ...] = (1, 8, 32, 128, 256, 512, 1024)
    vocabs: tuple[int, ...] = (128256, 152064)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    paths: tuple[str, ...] = PATHS
    iters: int = 50
    warmup: int = 5
    seed: int = 0
    # Engine settings other than shapes come from this preset (max logits per request, logprobs).
    base: Config | None = None


def _sync():
    torch.cuda.synchronize()


def time_path(fn, iters: int, warmup: int) -> dict:
    """fn() issues a step and returns device tokens; the host read ends the timed region."""
    for _ in range(warmup):
        fn().cpu()
    _sync()
    steps, issues = [], []
    for _ in range(iters):
        dist.barrier()  # start every rank's step together so waits are the step's, not skew's
        _sync()
        t0 = time.perf_counter()
        tokens = fn()
        t1 = time.perf_counter()
        tokens.cpu()
        t2 = time.perf_counter()
        issues.append((t1 - t0) * 1e6)
        steps.append((t2 - t0) * 1e6)
    return {"median_us": float(np.median(steps)), "p90_us": float(np.percentile(steps, 90)),
            "issue_us": float(np.median(issues))}


def link_bytes(path: str, idx: np.ndarray, tp: int, rank: int, vocab_shard: int, elem: int) -> int:
    """Logits bytes this rank sends to its peers per step (records are negligible)."""
    n = idx.shape[0]
    if path in ("eager_allgather", "graph_allgather"):
        return n * vocab_shard * elem * (tp - 1)
    others = int(((idx % tp) != rank).sum())
    return others * vocab_shard * elem


def measure_peak_p2p_gbs(nbytes: int = 1 << 28) -> float:
    """Peer copy bandwidth GPU0 -> GPU1 (one direction), for the achieved-GB/s column."""
    if torch.cuda.device_count() < 2:
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


def _engine(cfg: Config, transport: str, strategy: str) -> Engine:
    engine = Engine(cfg.replace(transport=transport, strategy=strategy, graph_backend="cuda"))
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    engine.capture()
    return engine


def sweep_rank(rank: int, world: int, settings: SweepSettings) -> list[dict]:
    rows = []
    max_batch = max(settings.batches)
    for vocab in settings.vocabs:
        for dtype_name in settings.dtypes:
            base = settings.base or Config(vocab_size=vocab, max_num_reqs=max_batch)
            cfg = base.replace(vocab_size=vocab, max_num_reqs=max_batch, max_num_slots=2 * max_batch,
                               logits_dtype=dtype_name, buckets=tuple(sorted(settings.batches)))
            rows += _sweep_config(rank, world, cfg, settings)
            torch.cuda.empty_cache()
    return rows


def _sweep_config(rank: int, world: int, cfg: Config, settings: SweepSettings) -> list[dict]:
    dtype = DTYPES[cfg.logits_dtype]
    engines = {}
    if "graph_allgather" in settings.paths:
        engines["graph_allgather"] = _engine(cfg, "nccl", "replicate")
    if "graphshard_nccl" in settings.paths:
        engines["graphshard_nccl"] = _engine(cfg, "nccl", "shard")
    if "graphshard_p2p" in settings.paths:
        engines["graphshard_p2p"] = _engine(cfg, "p2p", "shard")
    any_engine = next(iter(engines.values()))
    vocab_shard, layout, tables = any_engine.vocab_shard, any_engine.layout, any_engine.tables
    if "graphshard_p2p" in engines and engines["graphshard_p2p"].transport.name != "p2p":
        engines.pop("graphshard_p2p")  # symmetric memory unavailable: the engine fell back
    eager = {"eager_shard": EagerBatchShard, "eager_allgather": EagerAllGather}
    baselines = {name: cls(vocab_size=cfg.vocab_size, vocab_shard=vocab_shard, layout=layout, tables=tables)
                 for name, cls in eager.items() if name in settings.paths}
    rows = []
    gen = torch.Generator("cuda").manual_seed(settings.seed)
    for batch in settings.batches:
        idx = np.arange(batch, dtype=np.int32)  # low slots, as a bottom-up slot allocator fills them
        cu = np.arange(batch + 1, dtype=np.int32)
        seq_lens = np.full(batch, 128, dtype=np.int32)
        shard = (torch.randn(batch, vocab_shard, generator=gen, device="cuda") * 2).to(dtype)
        # The LM head writes its logits straight into the engine's static buffer (zero copy).
        static = {}
        for name, e in engines.items():
            static[name] = e.inputs.logits[:batch]
            static[name].copy_(shard)
        # Each path returns its whole [n, width] record block: the host reads it in one copy.
        fns = {name: (lambda e=e, x=static[name]: e.step(idx, cu, seq_lens, x).records)
               for name, e in engines.items()}
        fns.update({name: (lambda b=b: b.step(idx, cu, seq_lens, shard)) for name, b in baselines.items()})
        if batch == settings.batches[0]:
            # One-off costs of the first timed steps (allocator, communicator and host caches)
            # otherwise land in the first batch size measured.
            for fn in fns.values():
                time_path(fn, iters=5, warmup=20)
        reference = None
        for name in settings.paths:
            if name not in fns:
                continue
            stats = time_path(fns[name], settings.iters, settings.warmup)
            tokens = fns[name]().reshape(batch, -1)[:, 0].cpu()
            if reference is None:
                reference = tokens
            nbytes = link_bytes(name, idx, world, rank, vocab_shard, shard.element_size())
            rows.append(dict(path=name, batch=batch, vocab=cfg.vocab_size, dtype=cfg.logits_dtype,
                             rank=rank, tp=world, bytes=nbytes, agrees=bool(torch.equal(tokens, reference)),
                             gbs=nbytes / (stats["median_us"] * 1e-6) / 1e9 if nbytes else 0.0, **stats))
    return rows


def _spawned(rank: int, world: int, settings: SweepSettings):
    rows = sweep_rank(rank, world, settings)
    peak = measure_peak_p2p_gbs() if rank == 0 else None
    return {"rows": rows, "peak_gbs": peak}


def summarize(results: list[dict]) -> tuple[list[dict], float]:
    """Per (vocab, dtype, batch, path): the slowest rank's median (a step ends when all ranks end)."""
    peak = results[0]["peak_gbs"]
    merged = {}
    for res in results:
        for row in res["rows"]:
            key = (row["vocab"], row["dtype"], row["batch"], row["path"])
            cur = merged.get(key)
            if cur is None or row["median_us"] > cur["median_us"]:
                merged[key] = dict(row)
            merged[key]["agrees"] = merged[key]["agrees"] and row["agrees"]
    table = sorted(merged.values(), key=lambda r: (r["vocab"], r["dtype"], r["batch"], PATHS.index(r["path"])))
    by_cell = {}
    for r in table:
        by_cell.setdefault((r["vocab"], r["dtype"], r["batch"]), {})[r["path"]] = r
    for cell in by_cell.values():
        for r in cell.values():
            r["pct_peak"] = 100.0 * r["gbs"] / peak if peak and peak == peak else float("nan")
            for base in BASELINES:
                if base in cell:
                    r[f"speedup_vs_{base}"] = cell[base]["median_us"] / r["median_us"]
    return table, peak


def markdown(table: list[dict], peak: float) -> str:
    lines = [f"Peer copy peak measured in the same run: {peak:.0f} GB/s (GPU0 -> GPU1).", ""]
    header = ("| vocab | dtype | batch | path | median us | p90 us | host issue us | MB/rank | GB/s | "
              "x eager_shard | x eager_allgather | x graph_allgather | same tokens |")
    lines += [header, "|" + "---|" * 13]
    for r in table:
        lines.append(
            f"| {r['vocab']} | {r['dtype']} | {r['batch']} | {r['path']} | {r['median_us']:.0f} | "
            f"{r['p90_us']:.0f} | {r['issue_us']:.1f} | {r['bytes'] / 1e6:.2f} | {r['gbs']:.0f} | "
            + " | ".join(f"{r.get(f'speedup_vs_{b}', float('nan')):.2f}" for b in BASELINES)
            + f" | {'yes' if r['agrees'] else 'NO'} |")
    return "\n".join(lines)


def plot(table: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(r["vocab"], r["dtype"]) for r in table})
    fig, axes = plt.subplots(1, len(cells), figsize=(6 * len(cells), 4.5), squeeze=False)
    for ax, (vocab, dtype) in zip(axes[0], cells):
        for name in PATHS:
            pts = sorted((r["batch"], r["median_us"]) for r in table
                         if r["path"] == name and r["vocab"] == vocab and r["dtype"] == dtype)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel("step latency incl. host read (us, median)")
        ax.set_title(f"V={vocab} {dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(settings: SweepSettings, out_dir: Path, tp: int | None = None) -> list[dict] | None:
    """Spawn one process per GPU, or, under torchrun (RANK set), run this rank and gather to rank 0."""
    from graphshard.distributed import init_from_env, spawn

    if "RANK" in os.environ:
        info = init_from_env("nccl")
        mine = _spawned(info.rank, info.world_size, settings)
        results = [None] * info.world_size
        dist.all_gather_object(results, mine)
        if info.rank != 0:
            return None
        tp = info.world_size
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            raise SystemExit("the sweep needs at least 2 CUDA GPUs (or a torchrun launch)")
        tp = tp or torch.cuda.device_count()
        results = spawn(_spawned, tp, settings, backend="nccl", timeout_s=3000.0)
    table, peak = summarize(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {**asdict(settings), "base": asdict(settings.base) if settings.base else None}
    (out_dir / "sweep.json").write_text(json.dumps({"settings": meta, "tp": tp,
                                                    "peak_gbs": peak, "rows": table}, indent=1))
    md = markdown(table, peak)
    (out_dir / "sweep.md").write_text(md + "\n")
    plot(table, out_dir / "sweep.png")
    print(md)
    return table
