"""A NumPy model of the scan's capture at large batch: how many hot lanes a two-chunk program
lists (which says the tile it reads them back in: `floors.capture_hot`) and how many tokens a
row's pool gets, for a benchmark setting over `randn * 3` logits.

Usage: python3 -m benchmarks.capture_model [--mode top_p|top_k|logprobs_5|logprobs_20]
       [--vocab 152064] [--dtype float32|bfloat16] [--rows 64]

It follows `floors.capture_above_floors` for rows without a bitmask, with a row's programs run
in order (at large batch the grid runs a row's programs one batch-wide wave after another): the
first program publishes a radix floor over its lanes (folded to 256 for a need of at most 64),
later ones keep the published cut (a need of at most 64) or refine it with FLOOR_PIVOTS pivots.
A lane is the maximum of its columns over the program's chunks. No GPU is needed, and none
checked it: it models the code, not the machine.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from graphshard.sample.floors import (FLOOR_LANES, FLOOR_PIVOTS, FLOOR_PASSES, FLOOR_RADIX_BITS,
                                      HOT_FEW, HOT_SOME, SMALL_FLOOR_LANES)
from graphshard.sample.grid import SCAN_BLOCK_SIZE, SPLITS_PER_PROGRAM, scan_group
from graphshard.sample.kernels import chunk_top
from graphshard.sample.workspace import CHUNK_SIZE, HOT_LANES, HOT_TILE

# The grid the model's scan programs belong to: the largest row bound of SPLITS_PER_PROGRAM, so
# a program takes as many chunks as the kernels give it at large batch.
GRID_ROWS = SPLITS_PER_PROGRAM[-1][0]
NEEDS = {"top_p": None, "top_k": 50, "logprobs_5": 5, "logprobs_20": 20}


def radix_floor(lanes: np.ndarray, need: int) -> np.float32:
    """`floors.chunk_floor`: the need-th largest lane's order key, cut to the bits the radix
    passes decide."""
    value = np.sort(lanes)[::-1][need - 1].astype(np.float32)
    bits = int(value.view(np.uint32))
    key = ~bits & 0xFFFFFFFF if bits >> 31 else bits | 0x80000000  # by the sign bit, as -0.0
    key &= ~((1 << (32 - FLOOR_PASSES.value * FLOOR_RADIX_BITS.value)) - 1) & 0xFFFFFFFF
    bits = key ^ 0x80000000 if key & 0x80000000 else ~key & 0xFFFFFFFF
    return np.uint32(bits).view(np.float32)


def refine_floor(lanes: np.ndarray, need: int, low: float) -> float:
    """`floors.refine_floor`: the largest of FLOOR_PIVOTS pivots over [low, top] that `need`
    lanes reach."""
    pivots = FLOOR_PIVOTS.value
    step = (lanes.max() - low) / pivots
    reached = int(((lanes[None, :] >= low + step * np.arange(pivots)[:, None]).sum(1) >= need)
                  .sum())
    return low + step * max(reached - 1, 0)


def model(mode: str, vocab: int, rows: int, dtype: str = "float32",
          seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """-> (hot lanes of every program, pool entries of every row). bfloat16 logits are the
    fp32 ones rounded (more ties, so more lanes reach a cut)."""
    rs = np.random.default_rng(seed)
    splits = -(-vocab // CHUNK_SIZE)
    group = scan_group(GRID_ROWS, splits, None)
    programs = -(-splits // group)
    hot, pools = [], []
    for _ in range(rows):
        x = np.full(splits * CHUNK_SIZE, -np.inf, np.float32)
        x[:vocab] = rs.standard_normal(vocab).astype(np.float32) * 3
        if dtype != "float32":
            x = torch.from_numpy(x).to(getattr(torch, dtype)).float().numpy()
        cut, pool = None, 0
        for p in range(programs):
            cols = x[p * group * CHUNK_SIZE:(p + 1) * group * CHUNK_SIZE]
            lanes = cols.reshape(-1, SCAN_BLOCK_SIZE).max(0)
            count = min(group, splits - p * group)
            need = NEEDS[mode] or min(chunk_top(SCAN_BLOCK_SIZE, splits) * count, FLOOR_LANES)
            small = need * 4 <= SMALL_FLOOR_LANES
            if cut is None:
                folded = lanes.reshape(SMALL_FLOOR_LANES, -1).max(1) if small else lanes
                cut = radix_floor(folded, need)
            elif not small:
                cut = max(cut, refine_floor(lanes, need, cut))
            hot.append(int((lanes >= cut).sum()))
            pool += int((cols >= cut).sum())
        pools.append(pool)
    return np.array(hot), np.array(pools)


def tile(num_hot: int) -> str:
    """The listing tile(s) `floors.capture_hot` reads `num_hot` hot lanes back in."""
    if num_hot <= HOT_FEW.value:
        return str(HOT_FEW.value)
    if num_hot <= HOT_SOME.value:
        return str(HOT_SOME.value)
    if num_hot <= HOT_TILE.value:
        return str(HOT_TILE.value)
    if num_hot <= HOT_LANES.value:
        return f"{HOT_TILE.value}+{HOT_LANES.value - HOT_TILE.value}"
    return "tile by tile"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="top_p", choices=sorted(NEEDS))
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args(argv)
    hot, pools = model(args.mode, args.vocab, args.rows, args.dtype)
    group = scan_group(GRID_ROWS, -(-args.vocab // CHUNK_SIZE), None)
    print(f"{args.mode}, V = {args.vocab} {args.dtype}, {args.rows} rows, {group} chunks per "
          "program")
    print(f"hot lanes per program: mean {hot.mean():.0f}, median {np.median(hot):.0f}, "
          f"p90 {np.percentile(hot, 90):.0f}, max {hot.max()}")
    tiles, counts = np.unique([tile(h) for h in hot], return_counts=True)
    print("listing tiles: " + ", ".join(f"{t}: {100 * c / len(hot):.0f} %"
                                        for t, c in zip(tiles, counts)))
    print(f"pool entries per row: mean {pools.mean():.0f}")


if __name__ == "__main__":
    main()
