"""Two steps in flight on real GPUs: a loop that reads each step's tokens one step late (its host
copy enqueued before the next step is issued) gets every step's own tokens, on both transports
and at tp = 1, with batch sizes and slots changing every step; at tp = 1 `Engine.read` gets them
from the step's own copy to pinned memory, at once or one step late."""

import os

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.sample.params import SamplingParams
from graphshard.engine.readout import HostRecords
from graphshard.plan.staging import Staging

GPU_TP = int(os.environ.get("GRAPHSHARD_GPU_TP", "2"))
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
needs_group = pytest.mark.skipif(torch.cuda.device_count() < GPU_TP,
                                 reason=f"needs {GPU_TP} CUDA GPUs (GRAPHSHARD_GPU_TP)")

CFG = Config(vocab_size=32000, max_num_reqs=64, max_num_slots=128, buckets=(1, 8, 32, 64),
             graph_backend="cuda", timeout_s=30.0)


def _random_step(engine, cfg, rng, gen, lo, hi):
    """Issue one step of a random batch (size and slots from `rng`) whose rows each hold one
    logit far above the rest; this rank's columns are lo..hi. -> (the step's output, n, the
    tokens it must sample: the rows' argmax, on the device, read later)."""
    n = int(rng.integers(1, cfg.max_num_reqs + 1))
    idx = rng.choice(cfg.max_num_slots, n, replace=False).astype(np.int32)
    full = torch.randn(n, engine.vocab, generator=gen, device="cuda")
    full.scatter_(1, torch.randint(0, cfg.vocab_size, (n, 1), generator=gen, device="cuda"), 64.0)
    static = engine.inputs.logits[:n]
    static.copy_(full[:, lo:hi])  # stream-ordered after the step in flight
    # Both ways of saying the logits are in place: the view, or None (odd and even batches).
    out = engine.step(idx, np.arange(n + 1, dtype=np.int32), np.full(n, 9, np.int32),
                      static if n % 2 else None)
    return out, n, full[:, :cfg.vocab_size].argmax(dim=1).int()


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
        out, n, want = _random_step(engine, cfg, rng, gen, lo, hi)
        most_in_flight = max(most_in_flight, k - engine.inputs.staged.finished())
        host = torch.empty(n, dtype=torch.int32, pin_memory=True)
        host.copy_(out.sampled_token_ids[:, 0], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
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


@pytest.mark.parametrize("transport, tp", [pytest.param("p2p", GPU_TP, marks=needs_group),
                                           pytest.param("nccl", GPU_TP, marks=needs_group),
                                           ("auto", 1)])
def test_a_loop_reading_one_step_late_gets_every_steps_own_tokens(transport, tp, gpu_report):
    cfg = CFG.replace(transport=transport)
    if tp == 1:
        results = [_one_step_late(0, 1, cfg, 400)]
    else:
        results = spawn(_one_step_late, tp, cfg, 400, backend="nccl", timeout_s=600)
    gpu_report(f"one_step_late_{transport}_tp{tp}", results[0])
    assert all(r["mismatches"] == 0 for r in results), results


def _read_loop(cfg, steps):
    """tp = 1, changing n and slots: each step read with `read()` at once (against its device
    records) or, every other step, one step late (against the argmax computed with it)."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0, num_logprobs=slot % 3))
    rng = np.random.default_rng(7)
    gen = torch.Generator("cuda").manual_seed(7)
    late, mismatches, pending = 0, 0, None
    for k in range(steps):
        out, n, want = _random_step(engine, cfg, rng, gen, 0, engine.vocab)
        if pending is not None:  # step k - 1, read while step k may still run
            prev_want, prev_n = pending
            got = engine.read(k - 1)
            late += 1
            mismatches += got.records.shape[0] != prev_n or \
                not np.array_equal(got.sampled_token_ids[:, 0], prev_want.cpu().numpy())
            pending = None
        elif k % 2:
            pending = (want, n)
        else:
            got = engine.read()
            mismatches += not np.array_equal(got.records, out.to_host().records) or \
                not np.array_equal(got.sampled_token_ids[:, 0], want.cpu().numpy())
    engine.close()
    return {"mismatches": int(mismatches), "read_late": late}


def test_read_gives_every_step_its_own_records_at_once_or_one_step_late(gpu_report):
    cfg = CFG.replace(num_logprobs=2)
    result = _read_loop(cfg, 400)
    gpu_report("read_tp1", result)
    assert result["mismatches"] == 0 and result["read_late"] > 100, result


@pytest.mark.parametrize("grid_for", [1, 1024])
def test_publish_copies_every_record_to_the_host_before_the_done_word(grid_for):
    """`HostRecords.publish` on the GPU, one program or twelve (1024 records of 46 words): the
    host polls the done word without a stream wait and then finds all of the step's records;
    the device block holds the first two words of each of them, nothing past n."""
    staging = Staging(max_num_reqs=1024, device=torch.device("cuda"))
    records = torch.zeros(1024, 46, dtype=torch.int32, device="cuda")
    host = HostRecords(records, staging, staging.views()[0], tokens_per_record=2)
    idx = np.arange(1024, dtype=np.int32)
    for step in range(40):
        n = 1024 - 7 * step
        staging.write(step, idx[:n], np.arange(n + 1, dtype=np.int32), idx[:n], False)
        staging.fetch()
        records.fill_(step + 1)
        host.publish(grid_for)
        while staging.finished() < step:
            pass
        rows = host.rows(step, n)
        assert (rows == step + 1).all(), (step, np.unique(rows))
        torch.cuda.synchronize()  # the device block is read in stream order, not by the done word
        assert (host.tokens[:n] == step + 1).all() and (host.tokens[n:] <= step).all(), step
