"""The engine on real GPUs: both transports on 2 GPUs, CUDA graphs, every step against the oracle."""

import os
import time

import numpy as np
import pytest
import torch

from graphshard.config import Config, default_buckets
from graphshard.harness.demo import DemoSettings, run_rank
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams, SlotTables

# GRAPHSHARD_GPU_TP=4 (or 8) runs these on more GPUs of one host.
GPU_TP = int(os.environ.get("GRAPHSHARD_GPU_TP", "2"))
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < GPU_TP,
    reason=f"needs {GPU_TP} CUDA GPUs (GRAPHSHARD_GPU_TP)")

MIXED = Config(vocab_size=32000, max_num_reqs=96, max_num_logits_per_req=3, max_num_slots=192,
               logits_dtype="bfloat16", transport="nccl",
               graph_backend="cuda", num_logprobs=3)


def _loop(rank, world, cfg, steps, seed):
    return run_rank(rank, world, cfg, DemoSettings(steps=steps, seed=seed))



@pytest.mark.parametrize("transport", ["nccl", "p2p"])
def test_mixed_workload_equals_oracle(transport, gpu_report):
    cfg = MIXED.replace(transport=transport, buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64))
    results = spawn(_loop, GPU_TP, cfg, 300, 11, backend="nccl", timeout_s=900)
    r0 = results[0]
    # At tp = 1 (GRAPHSHARD_GPU_TP=1) a step exchanges nothing: no transport.
    assert r0["transport"] == (transport if GPU_TP > 1 else "none")
    assert sum(r["verified"] for r in results) == 300
    assert r0["eager_fallbacks"] > 0
    gpu_report(f"mixed_{transport}", {"capture_s": r0["capture_s"],
                                   "issue_p50_us": float(np.median(r0["issue_us"])),
                                   "step_p50_us": float(np.median(r0["step_us"]))})


@pytest.mark.parametrize("transport", ["nccl", "p2p"])
def test_real_vocabulary_bf16_and_fp32(transport):
    for dtype in ("bfloat16", "float32"):
        cfg = Config(vocab_size=152064, max_num_reqs=40, max_num_logits_per_req=2, max_num_slots=80,
                     logits_dtype=dtype, buckets=(1, 8, 16, 32), transport=transport,
                     graph_backend="cuda", num_logprobs=2)
        results = spawn(_loop, GPU_TP, cfg, 60, 5, backend="nccl", timeout_s=900)
        assert sum(r["verified"] for r in results) == 60


def _many_replays(rank, world, cfg, steps):
    """Random buckets and n for many steps: greedy and seeded random rows, checked every step."""
    engine = Engine(cfg)
    t0 = time.perf_counter()
    engine.capture()
    capture_s = time.perf_counter() - t0
    oracle_tables = SlotTables(cfg.max_num_slots, engine.device)
    rng = np.random.default_rng(0)
    for slot in range(cfg.max_num_slots):
        p = SamplingParams(temperature=0.0 if slot % 2 else 0.8, seed=slot)
        engine.add_request(slot, p)
        oracle_tables.set(slot, p)
    gen = torch.Generator("cuda").manual_seed(1)
    lo, hi = rank * engine.vocab_shard, (rank + 1) * engine.vocab_shard
    for i in range(steps):
        n = int(rng.integers(0, cfg.max_num_reqs + 1))
        idx = rng.choice(cfg.max_num_slots, n, replace=False).astype(np.int32)
        cu = np.arange(n + 1, dtype=np.int32)
        lens = rng.integers(1, 1000, n).astype(np.int32)
        full = torch.randn(n, engine.vocab, generator=gen, device="cuda")
        out = engine.step(idx, cu, lens, full[:, lo:hi].contiguous())
        want = sample_unsharded(full, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                tables=oracle_tables, layout=engine.layout, vocab_size=cfg.vocab_size)
        why = compare(out, want)
        if why is not None:
            raise AssertionError(f"rank {rank} step {i} n={n}: {why}")
    torch.cuda.synchronize()
    stats = engine.stats()
    return {"capture_s": capture_s, "graphs": len(stats["replays"]),
            "replays": sum(stats["replays"].values()), "fallbacks": stats["eager_fallbacks"]}


@pytest.mark.parametrize("transport", ["nccl", "p2p"])
def test_ten_thousand_replays_default_buckets(transport, gpu_report):
    cfg = Config(vocab_size=4096, max_num_reqs=520, max_num_slots=1024,
                 buckets=tuple(b for b in default_buckets(520) if b <= 512),
                 transport=transport, graph_backend="cuda")
    results = spawn(_many_replays, GPU_TP, cfg, 10_000, backend="nccl", timeout_s=1200)
    r0 = results[0]
    assert r0["replays"] + r0["fallbacks"] == 10_000
    gpu_report(f"replays_{transport}", r0)


def _graph_memory(rank, world, cfg):
    engine = Engine(cfg)
    engine.capture()
    return engine.stats()["graph_memory_bytes"]


def test_all_bucket_graphs_fit_in_a_quarter_more_than_the_largest(gpu_report):
    base = Config(vocab_size=32000, max_num_reqs=256, max_num_slots=512, transport="nccl",
                  graph_backend="cuda")
    every = spawn(_graph_memory, GPU_TP, base, backend="nccl", timeout_s=600)[0]
    largest = spawn(_graph_memory, GPU_TP, base.replace(buckets=(256,)), backend="nccl", timeout_s=600)[0]
    gpu_report("graph_memory", {"all_buckets_bytes": every, "largest_alone_bytes": largest,
                             "num_buckets": len(base.buckets)})
    assert every <= 1.25 * max(largest, 1 << 20)
