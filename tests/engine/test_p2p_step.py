"""The p2p step on CPU (interpreted kernels across gloo processes, emulated graphs): what one
captured step launches, and long runs of back-to-back steps (shard and replicate graphs side by
side, eager steps above the largest bucket, batches changing every step) equal to the unsharded
oracle at tp 2 and 3."""

import os

import numpy as np
import pytest
import torch

import graphshard.engine.engine as engine_mod
from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.engine.strategy import REPLICATE, SHARD

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="p2p kernels on CPU run under TRITON_INTERPRET=1")

# Buckets 1, 2, 4 and batches up to 6: the largest bucket's strategy also runs eagerly above it.
CFG = Config(vocab_size=96, vocab_pad_multiple=8, max_num_reqs=6, max_num_logits_per_req=2,
             max_num_slots=12, buckets=(1, 2, 4), transport="p2p", graph_backend="emulated",
             strategy="auto")


def _side_by_side(graphs, keys, *timing_args):
    """Stands in for auto's timing runs: shard and replicate buckets alternate."""
    return {b: (SHARD, REPLICATE)[i % 2] for i, b in enumerate(keys)}, {}


def _engine(cfg: Config) -> tuple[Engine, SlotTables]:
    engine_mod.choose_strategies = _side_by_side  # this process only
    engine = Engine(cfg)
    engine.capture()
    tables = SlotTables(cfg.max_num_slots, engine.device)
    for slot in range(cfg.max_num_slots):
        params = SamplingParams(temperature=0.0) if slot % 3 == 0 else \
            SamplingParams(temperature=0.8, seed=1000 + slot)
        engine.add_request(slot, params)
        tables.set(slot, params)
    return engine, tables


def _random_batch(rng: np.random.Generator, cfg: Config, vocab: int):
    n = int(rng.integers(0, cfg.max_num_reqs + 1))
    idx = rng.choice(cfg.max_num_slots, n, replace=False).astype(np.int32)
    counts = rng.integers(1, cfg.max_num_logits_per_req + 1, n)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lens = rng.integers(1, 50, n).astype(np.int32)
    full = torch.zeros(int(cu[-1]), vocab)  # (from_numpy gives an empty array stride 0)
    full.copy_(torch.from_numpy(rng.standard_normal((int(cu[-1]), vocab)).astype(np.float32) * 3))
    drafts = torch.from_numpy(rng.integers(0, cfg.vocab_size, int(cu[-1])).astype(np.int32))
    return idx, cu, lens, full, drafts


def _back_to_back(rank, world, cfg, num_steps, seed):
    engine, tables = _engine(cfg)
    rng = np.random.default_rng(seed)  # the same batches on every rank
    lo, hi = rank * engine.vocab_shard, (rank + 1) * engine.vocab_shard
    checked, sizes = 0, []
    for step in range(num_steps):
        idx, cu, lens, full, drafts = _random_batch(rng, cfg, engine.vocab)
        out = engine.step(idx, cu, lens, full[:, lo:hi].contiguous(), draft_token_ids=drafts)
        sizes.append(idx.shape[0])
        if step % world == rank:  # the oracle's cost spread over the ranks
            want = sample_unsharded(full, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                    tables=tables, layout=engine.layout, vocab_size=cfg.vocab_size,
                                    draft_token_ids=drafts)
            why = compare(out, want)
            assert why is None, f"rank {rank} step {step} (n={idx.shape[0]}): {why}"
            checked += 1
    torch.distributed.barrier()  # every rank past every kernel: no flag can be in flight
    transport = engine.transport
    stats = engine.stats()
    return {"checked": checked, "sizes": sizes, "replays": stats["replays"],
            "eager_fallbacks": stats["eager_fallbacks"], "strategy": stats["strategy"],
            "done": engine.inputs.staged.finished(),
            "idle": not (transport._signals.any() or transport._arrivals.any())}


@pytest.mark.parametrize("tp, steps, seed", [(2, 60, 3), (3, 30, 5)])
def test_back_to_back_steps_on_p2p_equal_the_oracle(tp, steps, seed):
    results = spawn(_back_to_back, tp, CFG, steps, seed, timeout_s=900)
    r0 = results[0]
    assert sum(r["checked"] for r in results) == steps
    assert all(r["done"] == steps - 1 and r["idle"] for r in results)
    assert r0["strategy"] == {1: SHARD, 2: REPLICATE, 4: SHARD}
    used = {key[:2] for key, count in r0["replays"].items() if count}
    assert used == {(1, SHARD), (2, REPLICATE), (4, SHARD)}, r0["replays"]
    assert r0["eager_fallbacks"] > 0 and 0 in r0["sizes"]


def _launches(rank, world, cfg):
    """(kernel, the constexprs that shape a step) of every kernel one replay launches."""
    engine, _ = _engine(cfg)
    seen = []

    def recording(kernel, grid, *args, **kwargs):
        shape = {k: kwargs[k] for k in ("FENCE", "ALL_ROWS", "FENCE_BEFORE", "DONE", "CHANNEL")
                 if k in kwargs}
        seen.append((kernel.fn.__name__, shape))
        return real(kernel, grid, *args, **kwargs)

    import graphshard.plan.kernel
    import graphshard.plan.staging
    import graphshard.sample.kernels
    import graphshard.transports.p2p
    # runtime.launch too: a step's sampler call replays its recorded launches from there.
    modules = (graphshard.plan.kernel, graphshard.sample.kernels, graphshard.plan.staging,
               graphshard.transports.p2p, graphshard.runtime.launch)
    real = graphshard.runtime.launch.launch
    for module in modules:
        module.launch = recording
    launched = {}
    for n, strategy in ((1, SHARD), (2, REPLICATE)):
        seen.clear()
        engine.step(np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32),
                    np.zeros(n, np.int32), torch.zeros(n, engine.vocab_shard))
        launched[strategy] = [k for k in seen if not k[0].startswith(("_scan", "_finish"))]
        launched[strategy + " sampler"] = len(seen) - len(launched[strategy])
    return launched


def test_a_p2p_step_launches_one_barrier_per_exchange_and_no_done_kernel():
    """Batch 1 (shard): the fused fetch and plan, the row push with its end barrier only, the
    sampler, and the record push that ends the step. Replicate: the fetch, the all-gather push
    with its end barrier only, the sampler, and the close."""
    launched = spawn(_launches, 2, CFG, timeout_s=300)
    assert launched[0] == launched[1]
    got = launched[0]
    assert got[SHARD] == [
        ("_fetch_plan_kernel", {}),
        ("_push_rows_kernel", {"CHANNEL": 0, "ALL_ROWS": False, "FENCE": False}),
        ("_push_records_kernel", {"CHANNEL": 2, "FENCE_BEFORE": False, "DONE": True}),
    ], got[SHARD]
    assert got[REPLICATE] == [
        ("_fetch_kernel", {}),
        ("_push_rows_kernel", {"CHANNEL": 0, "ALL_ROWS": True, "FENCE": False}),
        ("_push_records_kernel", {"CHANNEL": 6, "FENCE_BEFORE": False, "DONE": True}),
    ], got[REPLICATE]
    # The scan with and without bitmask support (the step's flag picks one), the finish.
    assert got[SHARD + " sampler"] == got[REPLICATE + " sampler"] == 3
