"""Audit of the scan's capture floors against the logits, call by call: a check for a capture
that depends on timing (the scan's chunk programs share a cut through atomics, and the order in
which they publish varies between calls).

Usage: python3 -m benchmarks.floor_audit [--vocab 152064] [--dtype float32] [--mode top_p]
       [--batch 32] [--calls 22]

Runs the sampler as `benchmarks.profile_kernels` does (one mode of `benchmarks.sampling_modes`,
every row a one-row request, logits `randn * 3`) and after each call reads every row's chunk
floors (`P_FLOOR_S` of the workspace partials: tokens below a chunk's floor were not captured)
and the rows that left the candidate path. For rows with a top-k (at most SMALL_TOP_K) or a
top-p and no logprobs it checks, in float64 from the logits:
- `bound`: every floor lies at or below the largest, over the row's scan programs, of the
  program's `need`-th largest logit (`need`: the top-k, else `kernels.chunk_top` per chunk), as
  the floor searches and the shared cut guarantee. A row past it shows a capture fault.
- `nucleus`: the row's largest floor lies below its smallest kept logit (top-k, then top-p, as
  `graphshard.sample.reference` keeps them). A row past it cannot settle from its pool.
Prints one line per call and a summary; exits 1 when a `bound` fault was seen. Runs on a CPU
too (the interpreter, small vocabularies), where programs run one at a time.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from benchmarks.sampling_modes import MODES, make_logits, sampler_call
from graphshard.sample.grid import SCAN_BLOCK_SIZE, SPLITS_PER_PROGRAM, scan_group
from graphshard.sample.kernels import chunk_top
from graphshard.sample.reference import kept_mask
from graphshard.sample.workspace import NUM_PART, P_FLOOR_S, SMALL_TOP_K


def kept_floor(scores: np.ndarray, top_k: int, top_p: float) -> float:
    """The smallest score the row keeps after top-k then top-p (the reference's float64 filter)."""
    return float(scores[kept_mask(scores, top_k, top_p, 0.0)].min())


def program_bound(row: np.ndarray, chunk: int, group: int, need_per: int, small_k: int) -> float:
    """The largest, over the row's scan programs, of the program's `need`-th largest logit."""
    best = -np.inf
    for lo in range(0, row.size, chunk * group):
        span = np.sort(row[lo:lo + chunk * group])[::-1]
        count = -(-span.size // chunk)
        need = small_k if small_k else need_per * count
        if need <= span.size:
            best = max(best, float(span[need - 1]))
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--mode", default="top_p", choices=list(MODES))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--calls", type=int, default=22)
    args = parser.parse_args(argv)
    params = MODES[args.mode]
    if params.num_logprobs or not (0 < params.top_k <= SMALL_TOP_K or params.top_p < 1.0):
        parser.error("the audit covers rows with a top-k (at most SMALL_TOP_K) or a top-p and "
                     "no logprobs")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    logits = make_logits(args.batch, args.vocab, dtype, device)
    call, ws = sampler_call(logits, args.vocab, params, 0, device)
    group = scan_group(args.batch, ws.num_splits, None)
    x = logits.float().cpu().numpy().astype(np.float64)
    small_k = params.top_k if 0 < params.top_k <= SMALL_TOP_K else 0
    top = chunk_top(SCAN_BLOCK_SIZE, ws.num_splits)
    bounds = np.array([program_bound(r, ws.chunk_size, group, top, small_k) for r in x])
    inv_temp = 1.0 / params.temperature
    kept = np.array([kept_floor(r * inv_temp, params.top_k, params.top_p) for r in x]) / inv_temp
    rows = args.batch
    faults = 0
    before = ws.paths()
    print(f"{args.mode} b={rows} V={args.vocab} {args.dtype}: {ws.num_splits} chunks, "
          f"{group} per program (SPLITS_PER_PROGRAM {SPLITS_PER_PROGRAM})")
    # The rows' partials [rows, NUM_PART, splits]: a view, read after each call.
    part = ws.partials[:rows * NUM_PART.value * ws.num_splits].view(rows, NUM_PART.value,
                                                                    ws.num_splits)
    for i in range(args.calls):
        call()
        if device == "cuda":
            torch.cuda.synchronize()
        floors = part[:, P_FLOOR_S.value].contiguous().view(torch.float32).cpu().numpy()
        top = floors.max(axis=1).astype(np.float64)
        bound = np.flatnonzero(top > bounds)
        nucleus = np.flatnonzero(top >= kept)
        after = ws.paths()
        delta = {k: after[k] - before[k] for k in after}
        before = after
        faults += bound.size
        print(f"call {i}: bound faults {bound.size} (rows {bound[:8].tolist()}), floors above "
              f"the kept set {nucleus.size} (rows {nucleus[:8].tolist()}), paths {delta}")
    print(f"{faults} bound faults over {args.calls} calls")
    sys.exit(1 if faults else 0)


if __name__ == "__main__":
    main()
