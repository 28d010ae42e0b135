"""The sweep: the decode loop a user runs, timed on the GPUs for each way to run the step.

Headline: back-to-back steps as a decode loop runs them: `out = engine.step(...)`, the sampled
ids read to the host (`.cpu()`), `engine.raise_if_failed()`; no barrier or synchronize between
steps; each step's logits written into the engine's static buffer (zero copy); greedy; random
distinct slots. Per (vocab, dtype, batch, path): the slowest rank's median and p90 step latency
and median host issue time (return from the step call). A barrier-aligned measurement (every
rank synchronized before each step) is kept as a second column.

Paths, tp = every GPU:
  bare_allgather_graph  all-gather of the vocab shards + argmax in one CUDA graph, no engine
  graphshard_p2p        engine, shard strategy, p2p transport
  graphshard_nccl       engine, shard strategy, NCCL transport
  graphshard_replicate  engine, replicate strategy (transport auto: p2p where it runs)
  graphshard_auto       engine, auto strategy (transport auto)
  eager_shard, eager_allgather   the eager baselines of `graphshard.harness.baselines`
and tp = 1, every GPU on its own: graphshard_tp1 (engine, greedy) and captured_argmax.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from graphshard.harness.bench_report import TP1_PATHS, TP_PATHS, summarize, write_results
from graphshard.config import Config
from graphshard.engine import DTYPES, Engine
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout

logger = logging.getLogger(__name__)

# Engine paths: (transport, strategy, divergence check). The headline paths run the default
# config (check on); the `_unchecked` ones measure the same step with it off, in the same run.
ENGINE_PATHS = {"graphshard_p2p": ("p2p", "shard", True), "graphshard_nccl": ("nccl", "shard", True),
                "graphshard_replicate": ("auto", "replicate", True),
                "graphshard_auto": ("auto", "auto", True),
                "graphshard_p2p_unchecked": ("p2p", "shard", False),
                "graphshard_nccl_unchecked": ("nccl", "shard", False)}


@dataclass(frozen=True)
class SweepSettings:
    batches: tuple[int, ...] = (1, 8, 32, 128, 256, 1024)
    vocabs: tuple[int, ...] = (152064,)
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    paths: tuple[str, ...] = TP_PATHS + TP1_PATHS
    iters: int = 200  # back-to-back steps timed per point
    warmup: int = 20
    aligned_iters: int = 30  # barrier-aligned steps per point (0: skip that column)
    seed: int = 0
    # Engine settings other than shapes come from this preset (max logits per request, logprobs).
    base: Config | None = None


# -- timing -------------------------------------------------------------------------------------
def time_loop(step, read, check, iters: int, warmup: int) -> dict:
    """The decode loop: `out = step(); read(out); check()` back to back. Step latency runs from
    the call to the end of `check`; issue time until `step` returned."""
    for _ in range(warmup):
        read(step())
        check()
    _align()
    issue, total = np.empty(iters), np.empty(iters)
    for i in range(iters):
        t0 = time.perf_counter()
        out = step()
        t1 = time.perf_counter()
        read(out)
        check()
        t2 = time.perf_counter()
        issue[i], total[i] = t1 - t0, t2 - t0
    return {"step_us": float(np.median(total)) * 1e6, "step_p90_us": float(np.percentile(total, 90)) * 1e6,
            "issue_us": float(np.median(issue)) * 1e6}


def time_aligned(step, read, iters: int) -> dict:
    """Every rank starts each step together, nothing in flight: the step alone."""
    total = np.empty(iters)
    for i in range(iters):
        _align()
        t0 = time.perf_counter()
        read(step())
        total[i] = time.perf_counter() - t0
    return {"aligned_step_us": float(np.median(total)) * 1e6}


def _align() -> None:
    if dist.is_initialized():
        dist.barrier()
    torch.cuda.synchronize()


# -- one rank ------------------------------------------------------------------------------------
def _engine(cfg: Config, transport: str, strategy: str, check: bool = True, group=None) -> Engine:
    engine = Engine(cfg.replace(transport=transport, strategy=strategy, graph_backend="cuda",
                                divergence_check=check), group=group)
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    engine.capture()
    return engine


def _greedy_tables(cfg: Config) -> SlotTables:
    tables = SlotTables(cfg.max_num_slots, torch.device("cuda", torch.cuda.current_device()))
    for slot in range(cfg.max_num_slots):
        tables.set(slot, SamplingParams(temperature=0.0))
    return tables


def sweep_rank(rank: int, world: int, settings: SweepSettings) -> dict:
    """This rank's rows (its own timings) and, from the auto engine, its per-bucket choices."""
    # tp = 1 paths run on single-rank groups, every GPU on its own (all ranks create all groups).
    solo = [dist.new_group([r]) for r in range(world)][rank]
    rows, auto = [], []
    max_batch = max(settings.batches)
    for vocab in settings.vocabs:
        for dtype_name in settings.dtypes:
            base = settings.base or Config(vocab_size=vocab, max_num_reqs=max_batch)
            cfg = base.replace(vocab_size=vocab, max_num_reqs=max_batch, max_num_slots=2 * max_batch,
                               logits_dtype=dtype_name, buckets=tuple(sorted(settings.batches)),
                               max_num_logits_per_req=1, num_logprobs=0, check_agreement=False)
            rows += _sweep_config(rank, world, cfg, settings, solo, auto)
            torch.cuda.empty_cache()
    return {"rows": rows, "auto": auto}


def _sweep_config(rank: int, world: int, cfg: Config, settings: SweepSettings, solo, auto: list) -> list[dict]:
    from graphshard.harness.baselines import (BareAllGatherGraph, CapturedArgmax, EagerAllGather,
                                      EagerBatchShard)

    dtype, want = DTYPES[cfg.logits_dtype], set(settings.paths)
    engines = {name: _engine(cfg, *how) for name, how in ENGINE_PATHS.items() if name in want}
    for name in ("graphshard_p2p", "graphshard_p2p_unchecked"):
        if name in engines and engines[name].transport.name != "p2p":
            logger.warning("p2p unavailable: %s left out", name)
            engines.pop(name).close()
    if "graphshard_auto" in engines:
        stats = engines["graphshard_auto"].stats()
        auto.append({"vocab": cfg.vocab_size, "dtype": cfg.logits_dtype, "strategy": stats["strategy"],
                     "timings_us": stats["strategy_timings_us"], "capture_s": stats["capture_s"]})
    tp1 = _engine(cfg, "auto", "shard", group=solo) if "graphshard_tp1" in want else None
    vocab = cfg.padded_vocab_size(world)
    vocab_shard = vocab // world
    layout = RecordLayout(cfg.max_num_logits_per_req, cfg.num_logprobs)
    eager = {name: cls(vocab_size=cfg.vocab_size, vocab_shard=vocab_shard, layout=layout,
                       tables=_greedy_tables(cfg))
             for name, cls in (("eager_shard", EagerBatchShard), ("eager_allgather", EagerAllGather))
             if name in want}
    rng = np.random.default_rng(settings.seed)  # the same draws on every rank: replicated inputs
    gen = torch.Generator("cuda").manual_seed(settings.seed)
    rows = []
    for batch in settings.batches:
        idx = rng.choice(cfg.max_num_slots, batch, replace=False).astype(np.int32)
        cu, lens = np.arange(batch + 1, dtype=np.int32), np.full(batch, 128, dtype=np.int32)
        full = (torch.randn(batch, vocab, generator=gen, device="cuda") * 2).to(dtype)
        # One clear winner per row (bfloat16 rows would otherwise tie at the top now and then).
        winners = torch.randint(0, cfg.vocab_size, (batch, 1), generator=gen, device="cuda")
        full.scatter_(1, winners, 64.0)
        shard = full[:, rank * vocab_shard:(rank + 1) * vocab_shard].contiguous()
        want_tokens = full[:, :cfg.vocab_size].argmax(dim=1).cpu()
        loops = {}  # path -> (step, read, check, tp)
        checked = {name for name, e in engines.items() if e.divergence is not None}
        for name, e in engines.items():
            loops[name] = _engine_loop(e, idx, cu, lens, shard) + (world,)
        if "bare_allgather_graph" in want:
            bare = BareAllGatherGraph(shard.clone(), cfg.vocab_size)
            loops["bare_allgather_graph"] = (bare.step, _read, _nothing, world)
        for name, b in eager.items():
            loops[name] = ((lambda b=b: b.step(idx, cu, lens, shard)), _read_first, _nothing, world)
        if tp1 is not None:  # its padded vocabulary is never wider than the group's
            loops["graphshard_tp1"] = _engine_loop(tp1, idx, cu, lens, full[:, :tp1.vocab]) + (1,)
        if "captured_argmax" in want:
            loops["captured_argmax"] = (CapturedArgmax(full.clone(), cfg.vocab_size).step, _read, _nothing, 1)
        for name in settings.paths:
            if name not in loops:
                continue
            step, read, check, tp = loops[name]
            row = dict(path=name, batch=batch, vocab=cfg.vocab_size, dtype=cfg.logits_dtype, tp=tp,
                       rank=rank, agreement=name in checked)
            row.update(time_loop(step, read, check, settings.iters, settings.warmup))
            if settings.aligned_iters:
                row.update(time_aligned(step, read, settings.aligned_iters))
            tokens = read(step()).reshape(batch, -1)[:, 0].long()
            check()
            row["same_tokens"] = bool(torch.equal(tokens, want_tokens))
            rows.append(row)
    for e in list(engines.values()) + ([tp1] if tp1 is not None else []):
        e.close()
    return rows


def _engine_loop(engine: Engine, idx, cu, lens, logits: torch.Tensor):
    """The decode loop's step on an engine: its logits written straight into the static buffer."""
    static = engine.inputs.logits[:idx.shape[0]]
    static.copy_(logits)
    return ((lambda: engine.step(idx, cu, lens, static)),
            (lambda out: out.sampled_token_ids.cpu()), engine.raise_if_failed)


def _read(tokens: torch.Tensor) -> torch.Tensor:
    return tokens.cpu()


def _read_first(records: torch.Tensor) -> torch.Tensor:
    return records.cpu()


def _nothing() -> None:
    return None


# -- driver ----------------------------------------------------------------------------------------
def run(settings: SweepSettings, out_dir: Path, tp: int | None = None) -> list[dict] | None:
    """Spawn one process per GPU, or, under torchrun (RANK set), run this rank and gather to rank 0."""
    from graphshard.harness.distributed import init_from_env, spawn

    if "RANK" in os.environ:
        info = init_from_env("nccl")
        mine = sweep_rank(info.rank, info.world_size, settings)
        results = [None] * info.world_size
        dist.all_gather_object(results, mine)
        if info.rank != 0:
            return None
        tp = info.world_size
    else:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
            raise SystemExit("the sweep needs at least 2 CUDA GPUs (or a torchrun launch)")
        tp = tp or torch.cuda.device_count()
        results = spawn(sweep_rank, tp, settings, backend="nccl", timeout_s=3000.0)
    rows = summarize([r["rows"] for r in results])
    meta = {**asdict(settings), "base": asdict(settings.base) if settings.base else None, "tp": tp}
    text = write_results(out_dir, rows, results[0]["auto"], meta)
    print(text)
    return rows
