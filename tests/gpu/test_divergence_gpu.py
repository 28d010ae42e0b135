"""The default divergence check on 2 GPUs, both transports: every kind of divergence raises the
same `RankDivergenceError` on every rank; a random run with divergence injected at random steps
detects every injection and accepts no wrong token; the check's cost per step, side by side with
it off. `DIVERGENCE_RUN_STEPS` sets the random run's length (default 300). Numbers go to
$OUT/gpu_report.jsonl."""

import os
import time

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.errors import InvalidBatchError, RankDivergenceError
from graphshard.sample.params import SamplingParams
from tests.engine.test_divergence import CFG, check_outcomes, diverging_run

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

RUN = Config(vocab_size=32000, max_num_reqs=16, max_num_slots=32, buckets=(1, 2, 4, 8, 16),
             graph_backend="cuda", timeout_s=30.0)
STEPS = int(os.environ.get("DIVERGENCE_RUN_STEPS", "300"))
KINDS = ("seq_lens", "order", "params", "missed_add_request", "unknown_slot_everywhere")


@pytest.mark.parametrize("transport", ["p2p", "nccl"])
def test_every_divergence_kind_raises_on_every_rank(transport):
    cfg = CFG.replace(transport=transport, graph_backend="cuda")
    check_outcomes(*spawn(diverging_run, 2, cfg, backend="nccl", timeout_s=300))


def _random_run(rank, world, cfg, steps, seed):
    """Random batches of greedy requests with one clear winner per row; at random steps rank 1
    diverges (the draw is replicated, the mistake is rank 1's). Counts what each step gave."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    lo, hi = engine.shard_columns()
    rng = np.random.default_rng(seed)
    gen = torch.Generator("cuda").manual_seed(seed)
    tally = dict(steps=0, injected=0, detected=0, missed=0, false_alarms=0, wrong_tokens=0,
                 refused_everywhere=0)
    for _ in range(steps):
        n = int(rng.integers(1, cfg.max_num_reqs + 1))
        idx = rng.choice(cfg.max_num_slots, n, replace=False).astype(np.int32)
        cu, lens = np.arange(n + 1, dtype=np.int32), rng.integers(1, 1000, n).astype(np.int32)
        full = torch.randn(n, engine.vocab, generator=gen, device="cuda")
        winners = torch.randint(0, cfg.vocab_size, (n, 1), generator=gen, device="cuda")
        full.scatter_(1, winners, 64.0)
        kind = KINDS[int(rng.integers(len(KINDS)))] if rng.random() < 0.1 else None
        mine = kind is not None and rank == 1
        slot = int(idx[0])
        if kind == "seq_lens" and mine:
            lens = lens + 1
        if kind == "order" and mine and n > 1:
            idx = idx[::-1].copy()
        if kind == "order" and n == 1:
            kind = None  # nothing to reorder
        if kind == "params" and mine:
            engine.add_request(slot, SamplingParams(temperature=0.5, seed=7), replace=True)
        if (kind == "missed_add_request" and mine) or kind == "unknown_slot_everywhere":
            engine.remove_request(slot)
        logits = engine.inputs.logits[:n]
        logits.copy_(full[:, lo:hi])
        tally["steps"] += 1
        tally["injected"] += kind is not None
        try:
            out = engine.step(idx, cu, lens, logits)
            tokens = out.sampled_token_ids[:, 0].cpu()
            engine.raise_if_failed()
            if kind is not None:
                tally["missed"] += 1
            if not torch.equal(tokens, winners[:, 0].cpu()):
                tally["wrong_tokens"] += 1
        except RankDivergenceError:
            tally["detected" if kind not in (None, "unknown_slot_everywhere") else "false_alarms"] += 1
        except InvalidBatchError:
            tally["refused_everywhere" if kind == "unknown_slot_everywhere" else "false_alarms"] += 1
        if kind == "params" and mine:
            engine.add_request(slot, SamplingParams(temperature=0.0), replace=True)
        if (kind == "missed_add_request" and mine) or kind == "unknown_slot_everywhere":
            engine.add_request(slot, SamplingParams(temperature=0.0))
    engine.close()
    return tally


@pytest.mark.parametrize("transport", ["p2p", "nccl"])
def test_random_run_detects_every_injected_divergence(transport, gpu_report):
    t0, t1 = spawn(_random_run, 2, RUN.replace(transport=transport), STEPS, 11, backend="nccl",
                   timeout_s=600)
    print(transport, t0)
    gpu_report(f"divergence_random_run_{transport}", t0)
    assert t0 == t1, (t0, t1)
    assert t0["missed"] == 0 and t0["false_alarms"] == 0 and t0["wrong_tokens"] == 0, t0
    assert t0["detected"] + t0["refused_everywhere"] == t0["injected"], t0


def _loop_us(rank, world, cfg, batches, steps):
    """The back-to-back decode loop (step, host read, raise_if_failed): median µs per step, per
    batch size."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(max(batches)):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    medians = {}
    for n in batches:
        idx, cu = np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32)
        lens = np.zeros(n, np.int32)
        logits = engine.inputs.logits[:n]
        logits.normal_()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step(idx, cu, lens, logits).sampled_token_ids.cpu()
            engine.raise_if_failed()
            times.append(time.perf_counter() - start)
        medians[n] = float(np.median(times[steps // 5:])) * 1e6
    engine.close()
    return medians


@pytest.mark.parametrize("transport", ["p2p", "nccl"])
def test_check_cost_is_measured(transport, gpu_report):
    """Not a timed assertion: the cost per step at batch 1 and 1024 goes to the report (the
    sweep's `_unchecked` rows measure it in the decode loop too)."""
    cfg = RUN.replace(vocab_size=152064, max_num_reqs=1024, max_num_slots=1024, buckets=(1, 1024),
                      transport=transport)
    on = spawn(_loop_us, 2, cfg, (1, 1024), 1000, backend="nccl", timeout_s=600)
    off = spawn(_loop_us, 2, cfg.replace(divergence_check=False), (1, 1024), 1000, backend="nccl",
                timeout_s=600)
    for n in (1, 1024):
        slow_on, slow_off = max(r[n] for r in on), max(r[n] for r in off)
        gpu_report(f"divergence_cost_{transport}", {"batch": n, "step_p50_us_on": slow_on,
                                                    "step_p50_us_off": slow_off,
                                                    "added_us": slow_on - slow_off})
        print(f"{transport} batch {n}: step p50 {slow_off:.1f} us off, {slow_on:.1f} us on")
