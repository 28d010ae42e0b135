"""Where a tp = 1 step's time goes on a GPU: the decode loop against the same graph replayed by
hand and a captured `argmax`, and the host time of each part of `Engine.step`.

Usage: python3 -m benchmarks.step_anatomy [--batches 1,32] [--steps 400] [--out anatomy.json]
One GPU, V = 152064 fp32, greedy. Every loop is back to back: issue, read the tokens to the host,
(engine) `raise_if_failed()`. Median µs over the steps after the first quarter. The parts are
timed by wrapping the engine's methods, which adds a little host time to the wrapped run only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import numpy as np
import torch

from benchmarks.sampling_modes import MODES, make_logits
from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.engine.routes import unmasked

VOCAB = 152064
PARTS = ("_check_step", "_admit", "_stage", "_run", "_settle")


def loop_us(issue, read, steps: int) -> tuple[float, float]:
    """(median step µs, median issue µs) of `issue(); read()` back to back."""
    total, issued = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        issue()
        t1 = time.perf_counter()
        read()
        total.append(time.perf_counter() - t0)
        issued.append(t1 - t0)
    skip = steps // 4
    return float(np.median(total[skip:])) * 1e6, float(np.median(issued[skip:])) * 1e6


def parts_us(engine: Engine, step, steps: int) -> dict[str, float]:
    """Host µs of each part of `step()`, by wrapping the engine's methods for one run."""
    spent = defaultdict(list)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            result = fn(*args, **kwargs)
            spent[name].append(time.perf_counter() - t)
            return result
        return wrapper

    for name in PARTS:
        setattr(engine, name, timed(name, getattr(engine, name)))
    try:
        for _ in range(steps):
            step()
    finally:
        for name in PARTS:
            delattr(engine, name)  # back to the class's methods
    return {name: float(np.median(t[steps // 4:])) * 1e6 for name, t in spent.items()}


def captured_argmax(x: torch.Tensor):
    """`x.argmax(-1)` captured in a CUDA graph; returns (graph, its output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            x.argmax(-1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = x.argmax(-1)
    torch.cuda.synchronize()
    return graph, out


def measure(batches, steps: int, device) -> list[dict]:
    cfg = Config(vocab_size=VOCAB, max_num_reqs=max(batches), max_num_slots=2 * max(batches),
                 buckets=tuple(batches), graph_backend="cuda", num_logprobs=0)
    engine = Engine(cfg, device=device)
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, MODES["greedy"])
    engine.capture()
    engine.inputs.logits[:max(batches)].copy_(make_logits(max(batches), engine.vocab,
                                                          torch.float32, device))
    rows = []
    for n in batches:
        idx = np.arange(n, dtype=np.int32) * 2
        cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 100, np.int32)
        view = engine.inputs.logits[:n]
        out = []

        def issue():
            out[:] = [engine.step(idx, cu, lens, view)]

        def read():
            out[0].sampled_token_ids.cpu()
            engine.raise_if_failed()

        row = {"batch": n}
        row["engine_step_us"], row["engine_issue_us"] = loop_us(issue, read, steps)
        row.update({f"part{name}_us": us for name, us in
                    parts_us(engine, lambda: (issue(), read()), steps).items()})
        # The graph `issue` replays: without bitmask support where the engine has one.
        key = engine._routes[n].key
        graph = engine.backend._graphs[unmasked(key) if engine.bitmask_free_graphs else key]
        records = engine.records[:n]
        row["graph_by_hand_step_us"], row["graph_by_hand_issue_us"] = loop_us(
            graph.replay, records.cpu, steps)
        argmax, tokens = captured_argmax(view)
        row["argmax_graph_step_us"], row["argmax_graph_issue_us"] = loop_us(
            argmax.replay, tokens.cpu, steps)
        rows.append(row)
    engine.close()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default="anatomy.json")
    args = parser.parse_args(argv)
    rows = measure([int(b) for b in args.batches.split(",")], args.steps, torch.device("cuda", 0))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for row in rows:
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in row.items()))


if __name__ == "__main__":
    main()
