"""Host cost of one step's Python, piece by piece: checks, staging, fault guard, the divergence
check's digest and verdict read, the whole call.

Usage: python3 -m benchmarks.host_path [--calls 20000]
Runs on any machine (tp = 1, CPU tensors): the graph replay is replaced by a no-op and the fault
guard's CUDA path is driven with a done word that says every step finished, so the numbers are
host code only: what `step()` (and a loop's `read()`) costs on top of the replay and the
device. Median ns per call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from graphshard.config import Config
from graphshard.engine.divergence import DivergenceCheck
from graphshard.engine import Engine
from graphshard.engine.faults import FaultGuard
from graphshard.plan.staging import Staging
from graphshard.sample.params import SamplingParams

BATCHES = (1, 8, 32, 128, 256, 1024)


def per_call_ns(fn, calls: int, repeats: int = 5) -> float:
    for _ in range(min(calls, 500)):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter_ns() - start) / calls)
    return float(np.median(runs))


class _P2PStatus:
    """The p2p transport's healthy fault read: one NumPy load of a status word."""

    def __init__(self):
        self._status_view = np.zeros(2, np.int32)

    def fault(self):
        if self._status_view[0] == 0:
            return None
        return "faulted"


def _engine() -> Engine:
    cfg = Config(vocab_size=256, vocab_pad_multiple=8, max_num_reqs=max(BATCHES),
                 max_num_slots=2 * max(BATCHES), buckets=BATCHES, graph_backend="emulated")
    engine = Engine(cfg, device="cpu")
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    # Routes as after capture, with the replay itself a no-op.
    engine.graphs.replayer = lambda key: (lambda: None)
    engine._routes = [engine._route(n) for n in range(cfg.max_bucket + 1)]
    engine.captured = True
    return engine


def _cuda_guard() -> FaultGuard:
    done = np.full(1, 1 << 60, dtype=np.int64)  # every step finished
    guard = FaultGuard(group=None, rank=0, world_size=2, device=torch.device("cuda", 0),
                       timeout_s=60.0, transport=_P2PStatus(), done=done)
    return guard


def _divergence_step(check: DivergenceCheck, guard: FaultGuard):
    """What the divergence check adds to a CUDA step's host path (tp > 1): the verdict read of
    the step before the previous one, and this step's host part of the digest (the device
    hashes the arrays)."""
    step = [10]

    def run():
        step[0] += 1
        check.begin(step[0], 12345, guard, check.flags(False, False))
    return run


def measure(calls: int) -> list[dict]:
    engine, guard = _engine(), _cuda_guard()
    check = DivergenceCheck(0, 2, torch.device("cpu"), Staging(max(BATCHES), torch.device("cpu")))
    rng = np.random.default_rng(0)
    rows = []
    for n in BATCHES:
        # Two batches of random distinct slots: alternating them defeats the checker's reuse of
        # the last accepted slots, as a batch whose requests changed would.
        a, b = (rng.choice(engine.config.max_num_slots, n, replace=False).astype(np.int32)
                for _ in range(2))
        cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 100, np.int32)
        x = engine.inputs.logits[:n]  # zero copy
        flip = [a, b]
        step = [0]

        def changed():
            flip.reverse()
            return engine._check_step(flip[0], cu, lens, x, None, None)

        def changed_step():
            flip.reverse()
            return engine.step(flip[0], cu, lens, x)

        def guard_step():
            step[0] += 1
            guard.check_standing()
            guard.admit(step[0])

        row = {"batch": n}
        row["checks, same slots"] = per_call_ns(lambda: engine._check_step(a, cu, lens, x, None, None), calls)
        row["checks, new slots"] = per_call_ns(changed, calls)
        row["stage"] = per_call_ns(lambda: engine.inputs.stage(5, a, cu, lens, False), calls)
        row["fault guard (CUDA path)"] = per_call_ns(guard_step, calls)
        row["divergence digest + verdict"] = per_call_ns(_divergence_step(check, guard), calls)
        row["step minus replay"] = per_call_ns(lambda: engine.step(a, cu, lens, x), calls // 4)
        row["step minus replay, new slots"] = per_call_ns(changed_step, calls // 4)
        # A decode loop's whole host turn: the logits view, the step, the read of its results.
        row["loop: view, step, read"] = per_call_ns(
            lambda: (engine.step(a, cu, lens, engine.inputs.logits[:n]), engine.read()), calls // 4)
        row["loop: step(logits=None), read"] = per_call_ns(
            lambda: (engine.step(a, cu, lens, None), engine.read()), calls // 4)
        rows.append(row)
    guard.close()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    rows = measure(args.calls)
    keys = list(rows[0])
    print("host ns per call (median of 5 runs; replay mocked, host code only)")
    print("| " + " | ".join(keys) + " |")
    print("|" + " ---: |" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) if k == "batch" else f"{r[k]:.0f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
