"""Two steps in flight on real GPUs: a loop that reads each step's tokens one step late (its host
copy enqueued before the next step is issued) gets every step's own tokens, on both transports
and at tp = 1, with batch sizes and slots changing every step."""

import os

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.sample.params import SamplingParams

GPU_TP = int(os.environ.get("GRAPHSHARD_GPU_TP", "2"))
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < GPU_TP,
    reason=f"needs {GPU_TP} CUDA GPUs (GRAPHSHARD_GPU_TP)")

CFG = Config(vocab_size=32000, max_num_reqs=64, max_num_slots=128, buckets=(1, 8, 32, 64),
             graph_backend="cuda", timeout_s=30.0)


def _one_step_late(rank, world, cfg, steps):
    engine = Engine(cfg)
    engine.capture()
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    rng = np.random.default_rng(5)  # replicated inputs: the same draws on every rank
    gen = torch.Generator("cuda").manual_seed(5)
    lo, hi = rank * engine.vocab_shard, (rank + 1) * engine.vocab_shard
    pending, mismatches, most_in_flight = None, 0, 0
    for k in range(steps):
        n = int(rng.integers(1, cfg.max_num_reqs + 1))
        idx = rng.choice(cfg.max_num_slots, n, replace=False).astype(np.int32)
        full = torch.randn(n, engine.vocab, generator=gen, device="cuda")
        full.scatter_(1, torch.randint(0, cfg.vocab_size, (n, 1), generator=gen, device="cuda"), 64.0)
        static = engine.inputs.logits[:n]
        static.copy_(full[:, lo:hi])  # stream-ordered after the step in flight
        out = engine.step(idx, np.arange(n + 1, dtype=np.int32), np.full(n, 9, np.int32), static)
        most_in_flight = max(most_in_flight, k - engine.inputs.staged.finished())
        host = torch.empty(n, dtype=torch.int32, pin_memory=True)
        host.copy_(out.sampled_token_ids[:, 0], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        want = full[:, :cfg.vocab_size].argmax(dim=1).int()  # on the device, read later
        if pending is not None:
            prev_host, prev_done, prev_want = pending
            prev_done.synchronize()
            engine.raise_if_failed(k - 1)
            mismatches += not torch.equal(prev_host, prev_want.cpu())
        pending = (host, done, want)
    host, done, want = pending
    done.synchronize()
    engine.raise_if_failed()
    mismatches += not torch.equal(host, want.cpu())
    engine.close()
    return {"mismatches": int(mismatches), "most_in_flight": most_in_flight}


@pytest.mark.parametrize("transport, tp", [("p2p", GPU_TP), ("nccl", GPU_TP), ("auto", 1)])
def test_a_loop_reading_one_step_late_gets_every_steps_own_tokens(transport, tp, gpu_report):
    cfg = CFG.replace(transport=transport)
    if tp == 1:
        results = [_one_step_late(0, 1, cfg, 400)]
    else:
        results = spawn(_one_step_late, tp, cfg, 400, backend="nccl", timeout_s=600)
    gpu_report(f"one_step_late_{transport}_tp{tp}", results[0])
    assert all(r["mismatches"] == 0 for r in results), results
