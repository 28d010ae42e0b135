"""The main job: a simulated decode loop on every rank, each step checked against the oracle.

Requests arrive and finish (slot churn), sampling parameters are mixed, some rows are
speculative or grammar-constrained, and batch sizes cross bucket edges and exceed the largest
bucket. At the end rank 0 prints what was verified and how long steps took.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.graphs import bucket_of
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SlotTables
from graphshard.sample.records import HostOutput, unpack
from graphshard.harness.workload import Batch, Workload


class VerificationError(AssertionError):
    """A sharded step returned something the unsharded oracle did not."""


@dataclass(frozen=True)
class DemoSettings:
    steps: int
    seed: int
    verify: bool = True
    capture: bool = True


@dataclass
class _Check:
    """What the oracle check of one step needs, kept until its rank runs it."""

    step: int
    batch: Batch
    full: torch.Tensor  # full-vocabulary logits
    drafts: torch.Tensor | None
    bitmask: torch.Tensor | None
    host: HostOutput  # the host copy of the step's results the loop read
    tables: SlotTables  # the slot tables as the step saw them


def progress(done: int, total: int, width: int = 30) -> None:
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} steps")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def device_inputs(batch: Batch, device: torch.device):
    """The batch's drafts and bitmask as device tensors (None where it has none)."""
    drafts = torch.from_numpy(batch.draft_token_ids).to(device) if batch.draft_token_ids is not None else None
    bitmask = torch.from_numpy(batch.grammar_bitmask).to(device) if batch.grammar_bitmask is not None else None
    return drafts, bitmask


def run_rank(rank: int, world_size: int, cfg: Config, settings: DemoSettings) -> dict:
    """One rank's decode loop (inside an initialized process group, or alone when tp = 1)."""
    engine = Engine(cfg)
    if settings.capture:
        engine.capture()
    oracle_tables = SlotTables(cfg.max_num_slots, engine.device)
    workload = Workload(cfg, settings.seed)
    lo, hi = engine.shard_columns()
    issue_us, step_us, sizes, verified = [], [], [], 0
    # Step i is checked by rank i % tp, after every rank has one step to check: the ranks then
    # run their unsharded oracles at the same time instead of waiting for each other's.
    pending: list[_Check] = []
    for i in range(settings.steps):
        batch = workload.next_batch()
        for slot in batch.removed:
            engine.remove_request(slot)
        for slot, params in batch.added:
            engine.add_request(slot, params)
            oracle_tables.set(slot, params)
        full = workload.logits(batch, engine.vocab, engine.dtype, engine.device)
        shard = full[:, lo:hi].contiguous()
        drafts, bitmask = device_inputs(batch, engine.device)
        _line_up(engine)
        start = time.perf_counter()
        out = engine.step(batch.idx_mapping, batch.cu_num_logits, batch.seq_lens, shard,
                          draft_token_ids=drafts, grammar_bitmask=bitmask)
        issued = time.perf_counter()
        host = engine.read()  # the host read a decode loop does every step (raises if failed)
        done = time.perf_counter()
        issue_us.append((issued - start) * 1e6)
        step_us.append((done - start) * 1e6)
        sizes.append(batch.num_reqs)
        if settings.verify:
            _check_ranks_agree(engine, out, rank, i)
            if i % world_size == rank:
                pending.append(_Check(i, batch, full, drafts, bitmask, host, _snapshot(oracle_tables)))
            if (i + 1) % world_size == 0 or i + 1 == settings.steps:
                for check in pending:
                    _verify(check, engine, rank)
                verified += len(pending)
                pending.clear()
        if rank == 0:
            progress(i + 1, settings.steps)
    stats = engine.stats()
    return {
        "rank": rank, "tp": world_size, "steps": settings.steps, "verified": verified,
        "max_batch": max(sizes) if sizes else 0, "eager_fallbacks": stats["eager_fallbacks"],
        "eager_steps": stats["eager_steps"], "replays": stats["replays"],
        "issue_us": issue_us, "step_us": step_us, "sizes": sizes, "captured": engine.captured,
        "capture_s": stats["capture_s"],
        "sampler_compile_s": stats["sampler_compile_s"],
        "sampler_variants_compiled": stats["sampler_variants_compiled"],
        "transport": stats["transport"], "graph_backend": stats["graph_backend"],
        "strategy": stats["strategy"], "device": str(engine.device),
    }


def _line_up(engine: Engine) -> None:
    """Start a timed step with this rank's device idle and every rank here: the ranks run their
    oracle checks between steps at different speeds, and a step timed from its own rank's start
    would count the wait for a peer that is still checking."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    if engine.group is not None:
        dist.barrier(group=engine.group)
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)


def _snapshot(tables: SlotTables) -> SlotTables:
    copy = SlotTables(tables.max_num_slots, tables.packed.device)
    copy.packed.copy_(tables.packed)
    return copy


def _verify(c: _Check, engine: Engine, rank: int) -> None:
    """The step's results, as the loop's host copy holds them, must equal the unsharded oracle's."""
    why = oracle_mismatch(engine, c.batch, c.full, c.drafts, c.bitmask, c.host, c.tables)
    if why is not None:
        raise VerificationError(f"rank {rank}, step {c.step} (n={c.batch.num_reqs}): {why}")


def oracle_mismatch(engine: Engine, batch: Batch, full: torch.Tensor, drafts, bitmask,
                    host: HostOutput, tables: SlotTables) -> str | None:
    """What differs between a step's host results and the unsharded oracle's on the same
    full-vocabulary logits, drafts, bitmask and slot tables (as the step saw them); None if
    nothing."""
    want = sample_unsharded(full, idx_mapping=batch.idx_mapping,
                            cu_num_logits=batch.cu_num_logits, seq_lens=batch.seq_lens,
                            tables=tables, layout=engine.layout,
                            vocab_size=engine.config.vocab_size, draft_token_ids=drafts,
                            grammar_bitmask=bitmask,
                            bitmask_support=engine.config.grammar_bitmask,
                            pdl=engine.programmatic_launch)
    return compare(unpack(torch.from_numpy(host.records), engine.layout), want)


def _check_ranks_agree(engine: Engine, out, rank: int, step: int) -> None:
    """Every rank must return the same records (all-gathered: they are a few bytes a request)."""
    if engine.group is None:
        return
    mine = engine.records[: out.num_sampled.shape[0]].contiguous()
    everyone = [torch.empty_like(mine) for _ in range(engine.tp_size)]
    dist.all_gather(everyone, mine, group=engine.group)
    for r, theirs in enumerate(everyone):
        if not torch.equal(theirs, mine):
            raise VerificationError(f"step {step}: rank {r}'s results differ from rank {rank}'s")


def _pct(values, q) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def report(results: list[dict], cfg: Config) -> str:
    """The end-of-run summary (rank 0's numbers; every rank verified the same steps)."""
    r0 = results[0]
    replays = {}
    for key, count in r0["replays"].items():
        replays[bucket_of(key)] = replays.get(bucket_of(key), 0) + count
    used = {b: c for b, c in sorted(replays.items()) if c}
    lines = [
        f"graphshard demo: tp={r0['tp']} device={r0['device']} transport={r0['transport']} "
        f"graphs={r0['graph_backend']} vocab={cfg.vocab_size} dtype={cfg.logits_dtype}",
        f"steps run: {r0['steps']}; every step: all ranks returned identical results and one rank "
        f"matched the unsharded oracle ({sum(r['verified'] for r in results)} oracle checks), mismatches: 0",
        f"largest batch: {r0['max_batch']} (largest bucket {cfg.max_bucket}); "
        f"eager fallbacks above it: {r0['eager_fallbacks']}; uncaptured eager steps: {r0['eager_steps']}",
        f"graph replays per bucket: {used}",
        f"capture time: {r0['capture_s']:.2f} s (of it compiling {r0['sampler_variants_compiled']} "
        f"sampler variants ahead: {r0['sampler_compile_s']:.2f} s)",
        f"host issue time per step: p50 {_pct(r0['issue_us'], 50):.0f} us, p99 {_pct(r0['issue_us'], 99):.0f} us",
        f"step time incl. host read (every rank idle and lined up before it): "
        f"p50 {_pct(r0['step_us'], 50):.0f} us, p99 {_pct(r0['step_us'], 99):.0f} us",
    ]
    eager = [t for t, n in zip(r0["step_us"], r0["sizes"]) if n > cfg.max_bucket]
    replayed = [t for t, n in zip(r0["step_us"], r0["sizes"]) if n <= cfg.max_bucket]
    if r0["captured"]:
        lines.append(f"  graph replays: {len(replayed)} steps, p50 {_pct(replayed, 50):.0f} us, "
                     f"p99 {_pct(replayed, 99):.0f} us; eager steps above the largest bucket: "
                     f"{len(eager)}, p50 {_pct(eager, 50):.0f} us")
    if r0["device"] == "cpu":
        lines.append("(CPU run: Triton interpreter and emulated graphs; times say nothing about GPU speed)")
    return "\n".join(lines)


def run(cfg: Config, tp: int, settings: DemoSettings) -> list[dict]:
    """Run the demo on `tp` processes (gloo on CPU, NCCL with GPUs), or in-process when tp = 1."""
    from graphshard.harness.distributed import spawn

    if tp == 1:
        return [run_rank(0, 1, cfg, settings)]
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < tp:
        raise SystemExit(f"tp={tp} needs {tp} GPUs, found {torch.cuda.device_count()}")
    return spawn(run_rank, tp, cfg, settings, backend=backend, timeout_s=3600.0)
