"""Reliability on 2 GPUs: a dead rank fails its peer within the bound (p2p barriers give up on
their own; NCCL inside graphs is bounded by the step watchdog), and a long random run stays
equal to the oracle with flat memory and step time. Numbers go to $OUT/gpu_report.jsonl."""

import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.engine.faults import StepFault
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams, SlotTables

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")

TIMEOUT_S = 5.0
LONG = Config(vocab_size=32000, max_num_reqs=64, max_num_slots=128, logits_dtype="float32",
              graph_backend="cuda", transport="p2p", timeout_s=30.0)



def _greedy_engine(cfg, n: int):
    """A captured engine with n greedy requests in slots 0..n-1, and the batch of all of them."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(n):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    batch = np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32)
    return engine, batch


def _until_death(rank, world, cfg, outdir):
    engine, (idx, cu, lens) = _greedy_engine(cfg, 8)
    shard = torch.randn(8, engine.vocab_shard, device=engine.device)
    record = {"rank": rank}
    for step in range(10):
        if rank == 1 and step == 5:
            os._exit(17)
        if step == 5:
            died_at = time.monotonic()
        try:
            engine.step(idx, cu, lens, shard).sampled_token_ids.cpu()  # the decode loop's read
            if step == 5:
                record["read_returned"] = time.monotonic() - died_at
            engine.raise_if_failed()  # before acting on the tokens
        except StepFault as e:
            record.update(step=step, elapsed=time.monotonic() - died_at, message=str(e))
            break
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(record))
    return record


@pytest.mark.parametrize("transport", ["p2p", "nccl"])
def test_dead_rank_fails_its_peer_within_the_bound(tmp_path, transport, gpu_report):
    cfg = Config(vocab_size=32000, max_num_reqs=16, buckets=(8, 16), transport=transport,
                 graph_backend="cuda", timeout_s=TIMEOUT_S)
    with pytest.raises(RuntimeError, match="exited with code 17"):
        spawn(_until_death, 2, cfg, str(tmp_path), backend="nccl", timeout_s=300,
              failure_grace_s=3 * TIMEOUT_S + 30)
    got = json.loads((tmp_path / "rank0.json").read_text())
    print(transport, got)
    gpu_report(f"dead_rank_{transport}", got)
    assert got["step"] == 5, got
    bound = TIMEOUT_S if transport == "p2p" else 2 * TIMEOUT_S
    assert got["elapsed"] <= bound + 5.0, got
    if transport == "p2p":
        assert "waiting for rank 1" in got["message"]
    else:
        assert "did not finish within" in got["message"]


def _long_run(rank, world, cfg, steps, check_every):
    """Random churn and batch sizes; greedy and seeded random rows; oracle on a sample of steps."""
    engine = Engine(cfg)
    engine.capture()
    tables = SlotTables(cfg.max_num_slots, engine.device)
    rng = np.random.default_rng(7)  # same stream on every rank: the inputs are replicated
    gen = torch.Generator("cuda").manual_seed(3)
    lo, hi = rank * engine.vocab_shard, (rank + 1) * engine.vocab_shard
    active: set[int] = set()
    step_s = np.zeros(steps)
    checked = mismatches = 0
    memory, want = [], None
    for i in range(steps):
        for slot in rng.choice(cfg.max_num_slots, 4, replace=False).tolist():  # churn
            if slot in active and rng.random() < 0.5:
                engine.remove_request(slot)
                active.discard(slot)
            elif slot not in active:
                p = SamplingParams(temperature=float(rng.choice([0.0, 0.7, 1.0])), seed=i * 131 + slot)
                engine.add_request(slot, p)
                tables.set(slot, p)
                active.add(slot)
        n = int(rng.integers(0, min(len(active), cfg.max_num_reqs) + 1))
        idx = rng.permutation(np.array(sorted(active), dtype=np.int32))[:n]
        cu = np.arange(n + 1, dtype=np.int32)
        lens = rng.integers(1, 4000, n).astype(np.int32)
        full = torch.randn(n, engine.vocab, generator=gen, device="cuda")
        start = time.perf_counter()
        out = engine.step(idx, cu, lens, full[:, lo:hi].contiguous())
        tokens = out.sampled_token_ids.cpu()
        engine.raise_if_failed()
        step_s[i] = time.perf_counter() - start
        if i % check_every == rank:
            want = sample_unsharded(full, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                    tables=tables, layout=engine.layout, vocab_size=cfg.vocab_size)
            checked += 1
            mismatches += compare(out, want) is not None or not torch.equal(tokens, want.sampled_token_ids.cpu())
        if (i + 1) % (steps // 10) == 0:
            del full, out, tokens  # only what the engine holds is left
            want = None
            torch.cuda.synchronize()
            memory.append((i + 1, torch.cuda.memory_allocated(), torch.cuda.memory_reserved(),
                           _rss_bytes()))
    engine.close()
    return {"checked": checked, "mismatches": int(mismatches), "memory": memory,
            "window_p50_us": [float(np.median(w)) * 1e6 for w in np.array_split(step_s, 10)],
            "step_p50_us": float(np.median(step_s)) * 1e6, "step_p99_us": float(np.percentile(step_s, 99)) * 1e6}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def test_long_run_equal_to_the_oracle_with_flat_memory_and_time(gpu_report):
    steps = int(os.environ.get("LONG_RUN_STEPS", "100000"))
    check_every = 50
    results = spawn(_long_run, 2, LONG, steps, check_every, backend="nccl", timeout_s=900)
    r0 = results[0]
    gpu_report("long_run", {"steps": steps, **{k: r0[k] for k in r0},
                         "checked_total": sum(r["checked"] for r in results)})
    assert sum(r["mismatches"] for r in results) == 0
    assert sum(r["checked"] for r in results) >= steps // check_every
    for r in results:
        first, last = r["memory"][0], r["memory"][-1]
        assert last[1] == first[1], r["memory"]  # GPU tensors: not a byte more
        assert last[2] - first[2] <= 8 << 20, r["memory"]  # allocator cache: no creep
        assert last[3] - first[3] < 64 << 20, r["memory"]  # host: allocator noise only
        # Window p50s move by +-30% with machine noise (seen: 198-335 us, in no order); a
        # slowdown would show as the later half running slower than the earlier half.
        windows = r["window_p50_us"]
        assert np.median(windows[5:]) <= 1.3 * np.median(windows[1:5]), windows


def _agreement_cost(rank, world, cfg, steps):
    engine, (idx, cu, lens) = _greedy_engine(cfg, 32)
    shard = torch.randn(32, engine.vocab_shard, device="cuda")
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step(idx, cu, lens, shard).sampled_token_ids.cpu()
        times.append(time.perf_counter() - start)
    engine.close()
    return float(np.median(times[steps // 5:])) * 1e6


def test_agreement_check_cost_is_measured(gpu_report):
    """Not a timed assertion: the debug mode's cost per step goes to the report."""
    cfg = LONG.replace(vocab_size=152064, max_num_reqs=32, buckets=(32,))
    off = spawn(_agreement_cost, 2, cfg, 2000, backend="nccl", timeout_s=600)
    on = spawn(_agreement_cost, 2, cfg.replace(check_agreement=True), 2000, backend="nccl",
               timeout_s=600)
    gpu_report("agreement_cost", {"batch": 32, "vocab": 152064, "step_p50_us_off": off[0],
                               "step_p50_us_on": on[0], "added_us": on[0] - off[0]})
    print(f"check_agreement: step p50 {off[0]:.1f} us off, {on[0]:.1f} us on")


def _lonely_p2p(rank, world, timeout_s):
    """Rank 1 sets up and then never launches a kernel again: how long each of rank 0's kernels
    waits, and what the status word says."""
    from graphshard.transports import make_transport

    transport = make_transport("p2p", None, torch.device("cuda", rank), timeout_s=timeout_s)
    transport.setup(max_num_rows=4, max_num_reqs=4, vocab_shard=4096, logits_dtype=torch.float32,
                    record_width=8)
    torch.distributed.barrier()
    if rank == 1:
        time.sleep(3 * timeout_s + 5)
        return None
    logits = torch.randn(4, 4096, device="cuda")
    timings = {}
    for name, launch in (("first push", lambda: transport.all_gather_vocab(logits, None, 4)),
                         ("second push", lambda: transport.all_gather_vocab(logits, None, 4)),
                         ("barrier", transport.barrier)):
        start = time.monotonic()
        launch()
        torch.cuda.synchronize()
        timings[name] = time.monotonic() - start
    return timings, transport.fault(), transport.num_blocks


def test_p2p_kernels_give_up_after_the_timeout_then_at_once(gpu_report):
    timings, fault, blocks = spawn(_lonely_p2p, 2, 2.0, backend="nccl", timeout_s=120)[0]
    print(timings, fault, blocks)
    gpu_report("p2p_give_up", {"timings_s": timings, "fault": fault, "num_blocks": blocks})
    assert fault == "p2p row push start barrier on rank 0 gave up after 2 s waiting for rank 1"
    assert 2.0 <= timings["first push"] <= 3.0, timings
    assert timings["second push"] < 0.5 and timings["barrier"] < 0.5, timings
