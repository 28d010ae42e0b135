"""How often a top-p row's nucleus reaches below its pool, by candidates captured per chunk: a
float64 NumPy model of the capture, not the kernels.

Usage: python3 -m benchmarks.pool_model [--vocab 32000] [--dtype bfloat16] [--rows 1000]
       [--tops 128,192,256] [--temperature 0.8] [--top-p 0.9]

Rows `randn * 3` in `--dtype` (as `benchmarks.sampling_modes.make_logits`, from a CPU
generator), scores over the temperature. A row's threshold T is the largest score whose mass at
or above it reaches top_p of the row's; a chunk of CHUNK_SIZE columns that captures its `top`
best scores leaves out everything below its `top`-th best, its floor (a chunk of at most `top`
columns has none). The model counts a row as
outgrowing its pool when T lies below the largest chunk floor: the kernels' shared cut also
captures no lower than that (`graphshard.sample.floors`), so such a row cannot settle from its
pool. The kernels capture a little more than `top` (their floor is a lower bound from lane
maxima, and ties), so the model's rates are upper bounds.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from graphshard.sample.workspace import CHUNK_SIZE


def outgrown(scores: np.ndarray, tops, top_p: float, chunk: int = CHUNK_SIZE) -> dict[int, bool]:
    """top -> whether the row's nucleus reaches below its largest chunk floor."""
    ordered = np.sort(scores)[::-1]
    mass = np.cumsum(np.exp(ordered - ordered[0]))
    threshold = ordered[np.searchsorted(mass, top_p * mass[-1])]
    chunks = [np.sort(scores[lo:lo + chunk])[::-1] for lo in range(0, scores.size, chunk)]
    # A chunk of at most `top` tokens captures them all: it leaves nothing out.
    return {top: threshold < max(c[top - 1] if c.size > top else -np.inf for c in chunks)
            for top in tops}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--tops", default="128,192,256")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.9)
    args = parser.parse_args(argv)
    tops = [int(t) for t in args.tops.split(",")]
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(args.rows, args.vocab, generator=gen) * 3).to(getattr(torch, args.dtype))
    scores = logits.double().numpy() / args.temperature
    counts = dict.fromkeys(tops, 0)
    for row in scores:
        for top, out in outgrown(row, tops, args.top_p).items():
            counts[top] += out
    for top in tops:
        print(f"vocab {args.vocab} {args.dtype}, {top} per chunk: {counts[top] / args.rows:.1%} "
              f"of {args.rows} rows outgrow the pool")


if __name__ == "__main__":
    main()
