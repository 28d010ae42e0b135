"""A warm top-p row's cost by how it settles: `top_p_warm` (temperature 1, top-p 0.9 over
`randn * 3`, a nucleus of thousands of tokens, more than the pool holds) with one seed after
another, batch 1. A warm row's finish checks the row's unfiltered winner against the nucleus
first; the row takes the deep draw (weighing passes over the row) only when the check rejects
it. The benchmark mode's one seed is such a row; this script shows what the other rows cost.

Usage: python3 -m benchmarks.warm_rows [--vocab 152064] [--dtype float32] [--seeds 9-40]
       [--out warm_rows.json]
One GPU. Per seed: the sampler's GPU µs per call (`bench_sampling.sampler_alone`: a graph of
10 calls, CUDA events, median of 10 replays), and the rows that took the slower paths in
those calls (`deep`: the deep draw; `deep_split`: the row weighed by all its finish programs;
`counted`: a count over the row).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
import torch

from benchmarks.bench_sampling import sampler_alone
from benchmarks.sampling_modes import MODES, make_logits


def seeds_arg(text: str) -> list[int]:
    first, _, last = text.partition("-")
    seeds = list(range(int(first), int(last or first) + 1))
    if not seeds:
        raise argparse.ArgumentTypeError(f"no seeds in {text!r}")
    return seeds


def by_path(rows: list[dict]) -> dict[str, list[float]]:
    """The seeds' sampler µs by the slowest path their row took: the deep draw's passes in one
    program (`deep`), the row weighed by all its finish programs and settled there
    (`deep_split`), a count over the row (`counted`), or the pool alone."""
    paths = {"deep draw": [], "weighed by the row's programs": [], "counted": [], "pool": []}
    for r in rows:
        name = ("deep draw" if r["deep"] else
                "weighed by the row's programs" if r.get("deep_split") else
                "counted" if r["counted"] else "pool")
        paths[name].append(r["sampler_gpu_us"])
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    ap.add_argument("--seeds", type=seeds_arg, default=seeds_arg("9-40"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("warm_rows needs a CUDA device")
    device = torch.device("cuda")
    logits = make_logits(1, args.vocab, getattr(torch, args.dtype), device)
    rows = []
    for seed in args.seeds:
        params = dataclasses.replace(MODES["top_p_warm"], seed=seed)
        us, paths = sampler_alone(logits, 1, args.vocab, params, device, pdl=True)
        rows.append(dict(seed=seed, sampler_gpu_us=us, **paths))
        print(f"seed {seed:3d}  {us:8.1f} us  {paths}", flush=True)
    for name, us in by_path(rows).items():
        if us:
            print(f"{name}: {len(us)} of {len(rows)} seeds, median {np.median(us):.1f} us "
                  f"(min {min(us):.1f}, max {max(us):.1f})")
    print(f"all: mean {np.mean([r['sampler_gpu_us'] for r in rows]):.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(vocab=args.vocab, dtype=args.dtype, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
