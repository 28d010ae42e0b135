"""The device timeline of the tp = 1 decode-loop step: when each of its operations starts and how
long it runs, against the same sampler replayed back to back.

Usage: python3 -m benchmarks.step_timeline [--shape 32000:bfloat16] [--modes greedy,top_k_top_p]
       [--batches 1,32] [--steps 200] [--no-grammar-bitmask] [--no-programmatic-launch]
       [--buckets 1,32,256,1024] [--k 20] [--out timeline.json]

By default the engine is built as `benchmarks.bench_sampling` builds it (buckets 1, 32, 256,
1024, layout K = 20), so its kernels come from the same compiled cache; `--buckets 1,8,32 --k 0`
launches `benchmarks.step_variants`' engines' sampler variants instead. The loop: `Engine.step`, then
`Engine.read()` (no device operation of its own). CUPTI (torch.profiler) gives every device
operation's start and end; per position in the step (the copy of the staged rows, the fetch,
the scan(s), the finish, the publish): mean µs from the step's first start to this start,
and mean duration. `span` is first start to last end, `idle` the device's idle time from one
step's end to the next one's start (the host's turn), `period` the mean step time.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from benchmarks.profile_kernels import device_events
from benchmarks.sampling_modes import MAX_LOGPROBS, MODES, make_logits
from graphshard.config import Config
from graphshard.engine import Engine

BUCKETS = (1, 32, 256, 1024)


def device_ops(fn, steps: int) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every device operation of `steps` calls of `fn`, in order."""
    ops = [(e.name, e.time_range.start, e.time_range.end)
           for e in device_events(fn, steps, warmup=20)]
    return sorted(ops, key=lambda op: op[1])


def per_position(ops, steps: int) -> dict:
    if not ops or len(ops) % steps:
        return {"error": f"{len(ops)} device operations over {steps} steps"}
    width = len(ops) // steps
    steps_ops = [ops[i * width:(i + 1) * width] for i in range(steps)]
    positions = []
    for k in range(width):
        starts = [s[k][1] - s[0][1] for s in steps_ops]
        durations = [s[k][2] - s[k][1] for s in steps_ops]
        positions.append({"name": steps_ops[0][k][0][:60], "start_us": float(np.mean(starts)),
                          "duration_us": float(np.mean(durations))})
    span = [max(op[2] for op in s) - s[0][1] for s in steps_ops]
    idle = [b[0][1] - max(op[2] for op in a) for a, b in zip(steps_ops, steps_ops[1:])]
    period = [b[0][1] - a[0][1] for a, b in zip(steps_ops, steps_ops[1:])]
    return {"positions": positions, "span_us": float(np.mean(span)),
            "idle_us": float(np.median(idle)), "period_us": float(np.median(period))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32000:bfloat16")
    parser.add_argument("--modes", default="greedy,top_k_top_p")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--no-grammar-bitmask", action="store_true",
                        help="an engine whose config has grammar_bitmask = false (at tp = 1 the "
                             "default engine's steps without a bitmask launch the same kernels)")
    parser.add_argument("--programmatic-launch", action=argparse.BooleanOptionalAction,
                        default=Config.programmatic_launch,
                        help="the engine config's programmatic_launch (default: the config's "
                             "default)")
    parser.add_argument("--buckets", default=",".join(map(str, BUCKETS)))
    parser.add_argument("--k", type=int, default=MAX_LOGPROBS, help="the config's num_logprobs")
    parser.add_argument("--out", default="timeline.json")
    args = parser.parse_args(argv)
    vocab, dtype = args.shape.split(":")
    vocab, device = int(vocab), torch.device("cuda", 0)
    buckets = tuple(int(b) for b in args.buckets.split(","))
    cfg = Config(vocab_size=vocab, max_num_reqs=max(buckets), max_num_slots=max(buckets),
                 logits_dtype=dtype, buckets=buckets, graph_backend="cuda",
                 num_logprobs=args.k, grammar_bitmask=not args.no_grammar_bitmask,
                 programmatic_launch=args.programmatic_launch)
    engine = Engine(cfg, device=device)
    engine.capture()
    engine.inputs.logits.copy_(make_logits(max(buckets), engine.vocab, getattr(torch, dtype),
                                           device))
    rows = []
    for mode in args.modes.split(","):
        for slot in range(max(buckets)):
            engine.add_request(slot, MODES[mode], replace=True)
        for n in (int(b) for b in args.batches.split(",")):
            idx, cu = np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32)
            lens, view = np.full(n, 100, np.int32), engine.inputs.logits[:n]
            ops = device_ops(lambda: (engine.step(idx, cu, lens, view), engine.read()), args.steps)
            row = {"vocab": vocab, "dtype": dtype, "mode": mode, "batch": n,
                   "grammar_bitmask": cfg.grammar_bitmask,
                   "programmatic_launch": engine.programmatic_launch,
                   **per_position(ops, args.steps)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    engine.close()
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
