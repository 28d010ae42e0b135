"""The tp = 1 step of engines that differ only in their size limits, timed in alternating rounds.

Usage: python3 -m benchmarks.step_configs [--shape 32000:bfloat16] [--batches 1,8] [--rounds 8]
       [--steps 200] [--out step_configs.json]

Three engines with the config's defaults otherwise (bitmask support, bitmask-free graphs,
programmatic launches), each capturing its buckets:
  A_buckets32_k0     buckets 1, 8, 32 (max_num_reqs 32), num_logprobs 0;
  C_buckets32_k20    the same with num_logprobs 20;
  B_buckets1024_k20  buckets 1, 8, 32, 256, 1024 (max_num_reqs 1024), num_logprobs 20: the
                     engine `benchmarks.bench_sampling` builds.
Per mode (greedy, top-k 50 + top-p 0.9) and batch (`--batches`, default 1 and 8; at most 32, the
rows every engine holds): each round runs every engine's loop
once (`--steps` back-to-back steps, each `step(..., logits=None)` then `read()`); an engine's
figure is [median, smallest] of its round medians, in µs. What a step costs beyond its batch
shows as the difference between the engines at the same batch.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from benchmarks.sampling_modes import MODES, make_logits
from benchmarks.step_variants import build, round_medians

DEFAULTS = dict(programmatic_launch=True, bitmask_free_graphs=True)
ENGINES = {"A_buckets32_k0": ((1, 8, 32), {}),
           "C_buckets32_k20": ((1, 8, 32), dict(num_logprobs=20)),
           "B_buckets1024_k20": ((1, 8, 32, 256, 1024), dict(num_logprobs=20))}
BATCHES = (1, 8)


def measure(vocab: int, dtype: torch.dtype, rounds: int, steps: int, device,
            batches=BATCHES) -> list[dict]:
    rows_used = min(max(buckets) for buckets, _ in ENGINES.values())  # every engine's rows
    if not batches or min(batches) < 1 or max(batches) > rows_used:
        raise ValueError(f"batches must lie in [1, {rows_used}], got {batches}")
    engines = {name: build(buckets, vocab, dtype, device, **DEFAULTS, **changes)
               for name, (buckets, changes) in ENGINES.items()}
    logits = make_logits(rows_used, next(iter(engines.values())).vocab, dtype, device)
    for e in engines.values():
        e.inputs.logits[:rows_used].copy_(logits)
    out = []
    for mode in ("greedy", "top_k_top_p"):
        for e in engines.values():
            for slot in range(rows_used):
                e.add_request(slot, MODES[mode], replace=True)
        for n in batches:
            idx, cu = np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32)
            lens = np.full(n, 100, np.int32)

            def loop_of(e):
                def step():
                    e.step(idx, cu, lens, None)
                    return e.read()
                return step

            loops = {name: loop_of(e) for name, e in engines.items()}
            medians = round_medians(loops, rounds, steps, warmup=50)
            row = {"mode": mode, "batch": n,
                   **{name: [round(float(np.median(v)), 1), round(float(np.min(v)), 1)]
                      for name, v in medians.items()}}
            out.append(row)
            print(json.dumps(row), flush=True)
    for e in engines.values():
        e.close()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32000:bfloat16", help="vocab:dtype")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="step_configs.json")
    args = parser.parse_args(argv)
    vocab, dtype = args.shape.split(":")
    batches = tuple(int(b) for b in args.batches.split(","))
    rows = measure(int(vocab), getattr(torch, dtype), args.rounds, args.steps,
                   torch.device("cuda", 0), batches)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
