"""Triton device functions of the deep nucleus draw: a top-p row whose nucleus reaches below its
pool (a flat row: temperature 1 over `randn * 3` keeps ~5000 tokens of 128256, a pool holds
~2000), settled by a few passes over the row in the program that settles it.

Each pass weighs the row at PIVOTS pivots (`weigh_row`: the mass and count at or above each,
accumulated per lane and reduced once), which says which interval between two pivots holds the
threshold. An interval of at most `limit` tokens is copied behind the pool (`race_and_copy`,
which also draws the Gumbel-max winner of the tokens above the interval), sorted, and its
threshold and best token found (`settle_copied`); a fuller one is weighed again at pivots
inside it. The first pass's pivots start at the pool's floor and are spaced by the row's density
there, as the pool measures it (`first_offsets`); an interval below the last finite pivot is
weighed again with steps of STEP.

Where the finish splits rows over programs, the row's programs may have weighed the first
round together (`deep_split`): the draw then starts from their interval, and copies it without
the RNG when no further round narrows it (they drew the winner above it).

The answer is the one-program search's (`rows.draw_filtered`) at the row's norm from its chunks
(as every pool answer is): the largest score T whose mass at or above it reaches top_p * norm,
and the Gumbel-max token among the scores >= T, ties by lower id. When the rounds run out, the
interval does not fit, or rounding makes the passes disagree, the caller falls back.
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample import rng
from graphshard.sample.candidates import PIVOTS, SORT_LIMIT, load_pool, mass_threshold
from graphshard.sample.floors import ID_BITS
from graphshard.sample.rows import load_four, load_masked

# Pivot spacing in score units (a mass ratio of e^0.25 between pivots) where the pool gives no
# density, and below the first pass's pivots: the threshold of top-p 0.9 at temperatures 1 to
# 2 over a Gaussian row lies 1-3 below the pool's floor, with ~1000 tokens per step at V =
# 128256 and temperature 1. The pool's count over the STEP above its floor measures the density.
STEP = tl.constexpr(0.25)
# Passes of pivots before the copy; the rest falls back.
ROUNDS = tl.constexpr(4)
# Lanes of the weighing passes' per-lane sums ([PIVOTS, WEIGH_LANES] of mass and of count). The
# finish's register pressure is set here, and every program of the finish pays for it, not only
# the rare row that takes this draw (H200, BENCHMARKS.md). With 512 lanes the finish took 240
# registers against 128: one program per SM instead of two. With 256 it kept 128 registers, but
# spilled 740 bytes against 192, with spill stores before the exit of a program that settles
# nothing: the batch-32 greedy finish took 4.1 µs against 3.0. With 128 lanes it spills 204
# bytes with 2 early stores, as without the deep draw, and the batch-32 finishes are back where
# they were. The 32000 bf16 finish with a bitmask (one program per row) still spills 500 bytes
# against none without the deep draw; 64 lanes remove that, untimed (BENCHMARKS.md).
WEIGH_LANES = tl.constexpr(128)
_NO_ID = tl.constexpr(2147483647)
# The first round's pivots (`first_offsets`): DENSE of them spaced so that each interval holds
# about AIM tokens (under SORT_LIMIT, so that a nucleus a few thousand tokens deeper than the
# pool settles in one round), the rest evenly out to REACH below the pool's floor, as far as
# PIVOTS - 1 steps of STEP reach. On an H100 a deep row at 152064 fp32, temperature 1, took 413
# µs against 566 with even steps of STEP (BENCHMARKS.md). In a NumPy model of the rounds, rows
# at temperature 1 took one round where even steps took two, rows at 1.2 and 1.5 two as
# before, and rows at 2 (V = 152064) three where even steps took two.
AIM = tl.constexpr(900.0)
DENSE = tl.constexpr(9)
REACH = tl.constexpr(3.5)


@triton.jit
def draw_deep_nucleus(row_ptr, mask_row_ptr, mask_on, pool_x, pool_id, n_pool, counter_ptr,
                      VOCAB: tl.constexpr, key, inv_temp, max_s, start, target, first,
                      CAP: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """-> (settled, token) of a top-p row (no top-k, no min-p) with a finite maximum score
    `max_s`. `start`: the first pivot (the best score an uncaptured token can have); `target`:
    top_p times the row's norm. Scratch: the pool's entries past `n_pool`, and one int32 word
    at `counter_ptr`. `first`: (known, lo, hi, carry, above, n_in, best_z, best_id), the first
    round's interval when the row's finish programs weighed it together (`deep_split`), with
    the Gumbel-max winner of the scores >= hi; when not `known`, this program weighs it."""
    at = tl.arange(0, PIVOTS)
    base = tl.maximum(tl.minimum(n_pool, CAP), 0)
    limit = tl.minimum(CAP - base, SORT_LIMIT)
    known, lo, hi, carry, above, n_in, known_z, known_id = first
    # The interval [lo, hi) that holds the threshold, the mass and count at or above hi.
    step = tl.where(lo > float("-inf"), (hi - lo) / (PIVOTS - 1), STEP)
    top = hi - step
    offsets = at.to(tl.float32) * step
    ok = (start > float("-inf")) & (start <= max_s) & (limit > 0)
    if ~known:
        hi = tl.full((), float("inf"), tl.float32)
        carry = tl.zeros((), tl.float32)
        above = tl.zeros((), tl.int32)
        top = start
        step = tl.full((), STEP, tl.float32)
        lo = hi
        n_in = tl.full((), 2147483647, tl.int32)
        offsets = first_offsets(pool_x, pool_id, n_pool, inv_temp, start, CAP, BLOCK)
    rounds = tl.zeros((), tl.int32)
    for _ in range(ROUNDS):
        if ok & (n_in > limit):
            # PIVOTS - 1 finite pivots from `top` down, the last at -inf: some pivot reaches
            # target unless rounding says otherwise.
            pivots = tl.where(at < PIVOTS - 1, top - offsets, float("-inf"))
            mass, count = weigh_row(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, max_s,
                                    pivots, WEIGH_LANES, HAS_BITMASK)
            j = tl.min(tl.where(mass >= target, at, PIVOTS), axis=0)
            prev_mass = tl.sum(tl.where(at == j - 1, mass, 0.0), axis=0)
            prev_count = tl.sum(tl.where(at == j - 1, count, 0), axis=0)
            new_lo = tl.max(tl.where(at == j, pivots, float("-inf")), axis=0)
            # The interval's upper end: the pivot before j, or the round's upper end.
            new_hi = tl.where(j > 0, tl.max(tl.where(at == j - 1, pivots, float("-inf")),
                                            axis=0), hi)
            new_carry = tl.where(j > 0, prev_mass, carry)
            new_above = tl.where(j > 0, prev_count, above)
            # The first pivot (the round's top) reaches target: the threshold lies above the
            # pivots, where the pool should have settled it. None reaching it: rounding.
            ok = (j < PIVOTS) & ((j > 0) | (hi < float("inf")))
            n_in = tl.sum(tl.where(at == j, count, 0), axis=0) - new_above
            lo, hi, carry, above = new_lo, new_hi, new_carry, new_above
            # A full finite interval is weighed again at pivots inside it; the one below the
            # last finite pivot, at the same step below it.
            step = tl.where(lo > float("-inf"), (hi - lo) / (PIVOTS - 1), step)
            top = hi - step
            offsets = at.to(tl.float32) * step
            rounds += 1
    settled = ok & (n_in <= limit) & (n_in > 0)
    token = tl.zeros((), tl.int32)
    if settled:
        tl.store(counter_ptr, 0)
        tl.debug_barrier()
        if known & (rounds == 0):
            # The row's programs drew the winner above the interval: a copy without the RNG.
            win_z, win_id = known_z, known_id
            copy_interval(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, lo, hi,
                          pool_x + base, pool_id + base, counter_ptr, limit, BLOCK, HAS_BITMASK)
        else:
            win_z, win_id = race_and_copy(row_ptr, mask_row_ptr, mask_on, VOCAB, key, inv_temp,
                                          lo, hi, pool_x + base, pool_id + base, counter_ptr,
                                          limit, BLOCK, HAS_BITMASK)
        tl.debug_barrier()  # the copies came from every thread
        copied = tl.atomic_or(counter_ptr, 0, sem="relaxed")
        settled = copied == n_in
        if settled:
            z, z_id = settle_copied(pool_x + base, pool_id + base, n_in, key, inv_temp, max_s,
                                    carry, target, SORT_LIMIT)
            better = (z > win_z) | ((z == win_z) & (z_id < win_id))
            token = tl.where(better, z_id, win_id)
            settled = tl.maximum(z, win_z) > float("-inf")
    return settled, token


@triton.jit
def no_interval():
    """`draw_deep_nucleus`'s `first` when no first round was weighed before it."""
    zero = tl.zeros((), tl.float32)
    none = tl.zeros((), tl.int32)
    return none != none, zero, zero, zero, none, none, zero, none


@triton.jit
def first_offsets(pool_x, pool_id, n_pool, inv_temp, start, CAP: tl.constexpr,
                  TILE: tl.constexpr):
    """How far below `start` the first round's pivots lie [PIVOTS] (0 first, rising). The row's
    count of scores at or above a value is taken to keep growing below `start` at the rate it
    grows over the STEP above it, which the pool measures (it holds every token at or above
    `start`): DENSE pivots where that count rises by AIM each, then even steps of at least STEP
    out to REACH. Even steps of STEP when the pool gives no rate. The pivots only decide how
    many rounds the draw takes, never its answer."""
    n0 = tl.zeros([TILE], tl.int32)
    n1 = tl.zeros([TILE], tl.int32)
    for t in range(0, CAP, TILE):
        if t < n_pool:
            s = load_pool(pool_x, pool_id, t, n_pool, inv_temp, TILE)[0]
            n0 += (s >= start).to(tl.int32)
            n1 += (s >= start + STEP).to(tl.int32)
    c0 = tl.sum(n0, axis=0).to(tl.float32)
    c1 = tl.sum(n1, axis=0).to(tl.float32)
    rate = tl.log(c0 / tl.maximum(c1, 1.0)) / STEP
    k = tl.arange(0, PIVOTS).to(tl.float32)
    dense = tl.log(1.0 + k * (AIM / tl.maximum(c0, 1.0))) / rate
    last = tl.log(1.0 + (DENSE - 1) * (AIM / tl.maximum(c0, 1.0))) / rate
    tail = tl.maximum(STEP, (REACH - last) / (PIVOTS - 1 - DENSE))
    offsets = tl.where(k < DENSE, dense, last + (k - (DENSE - 1)) * tail)
    usable = (c1 > 0.0) & (c0 > c1) & (rate < float("inf"))
    return tl.where(usable, offsets, k * STEP)


@triton.jit
def weigh_row(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, max_s, pivots,
              BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """The mass exp(s - max_s) and the count of the allowed finite scores at or above each of
    `pivots` [PIVOTS] -> ([PIVOTS] float32, [PIVOTS] int32). Per-lane sums, reduced once: a
    block-wide reduction per tile is what one program's whole-row searches wait on. Four tiles
    per step, all loaded before any is weighed: one program's pass waits on each step's loads
    (H200, a warm row's draw at V = 128256: 643 µs with two tiles of 128 lanes, 532 with four).
    """
    lanes = tl.arange(0, BLOCK)
    mass = tl.zeros([PIVOTS, BLOCK], tl.float32)
    count = tl.zeros([PIVOTS, BLOCK], tl.int32)
    for begin in range(0, VOCAB, 4 * BLOCK):
        a, b, c, d = load_four(row_ptr, mask_row_ptr, mask_on, begin + lanes, BLOCK, VOCAB,
                               HAS_BITMASK)
        mass, count = _weigh_tile(a[0], inv_temp, max_s, pivots, mass, count)
        mass, count = _weigh_tile(b[0], inv_temp, max_s, pivots, mass, count)
        mass, count = _weigh_tile(c[0], inv_temp, max_s, pivots, mass, count)
        mass, count = _weigh_tile(d[0], inv_temp, max_s, pivots, mass, count)
    return tl.sum(mass, axis=1), tl.sum(count, axis=1)


@triton.jit
def _weigh_tile(x, inv_temp, max_s, pivots, mass, count):
    s = x * inv_temp
    w = tl.where(x > float("-inf"), tl.exp(s - max_s), 0.0)
    hit = (x > float("-inf"))[None, :] & (s[None, :] >= pivots[:, None])  # [PIVOTS, BLOCK]
    return mass + tl.where(hit, w[None, :], 0.0), count + hit.to(tl.int32)


@triton.jit
def race_and_copy(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, key, inv_temp, lo, hi,
                  dest_x, dest_id, counter_ptr, limit, BLOCK: tl.constexpr,
                  HAS_BITMASK: tl.constexpr):
    """One pass: the Gumbel-max winner (s + g, lowest id) of the allowed finite scores >= hi,
    and the tokens with scores in [lo, hi) appended to dest (the first `limit`; the counter
    at `counter_ptr` ends at how many there are)."""
    lanes = tl.arange(0, BLOCK)
    best_z = tl.full([BLOCK], float("-inf"), tl.float32)
    best_id = tl.full([BLOCK], _NO_ID, tl.int32)
    for begin in range(0, VOCAB, BLOCK):
        offs = begin + lanes
        x = load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK)[0]
        s = x * inv_temp
        finite = x > float("-inf")
        z = tl.where(finite & (s >= hi), s + rng.gumbel(key, offs), float("-inf"))
        # Later tiles hold higher ids: a tie keeps the lane's earlier winner.
        better = z > best_z
        best_id = tl.where(better, offs, best_id)
        best_z = tl.where(better, z, best_z)
        _copy_tile(x, offs, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit)
    top_z = tl.max(best_z, axis=0)
    return top_z, tl.min(tl.where(best_z == top_z, best_id, _NO_ID), axis=0)


@triton.jit
def copy_interval(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, lo, hi, dest_x,
                  dest_id, counter_ptr, limit, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """`race_and_copy`'s copy alone, four tiles a step all loaded before any is copied: without
    the RNG one program's pass waits on loads, as a count over the row does."""
    lanes = tl.arange(0, BLOCK)
    for begin in range(0, VOCAB, 4 * BLOCK):
        offs = begin + lanes
        a, b, c, d = load_four(row_ptr, mask_row_ptr, mask_on, offs, BLOCK, VOCAB, HAS_BITMASK)
        _copy_tile(a[0], offs, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit)
        _copy_tile(b[0], offs + BLOCK, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit)
        _copy_tile(c[0], offs + 2 * BLOCK, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit)
        _copy_tile(d[0], offs + 3 * BLOCK, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit)


@triton.jit
def _copy_tile(x, offs, inv_temp, lo, hi, dest_x, dest_id, counter_ptr, limit):
    """Append the tile's allowed finite scores in [lo, hi) to dest (the first `limit`)."""
    s = x * inv_temp
    take = (x > float("-inf")) & (s >= lo) & (s < hi)
    pos = tl.atomic_add(counter_ptr + tl.zeros_like(offs), 1, mask=take, sem="relaxed")
    keep = take & (pos < limit)
    tl.store(dest_x + pos, x.to(tl.int32, bitcast=True), mask=keep)
    tl.store(dest_id + pos, offs, mask=keep)


@triton.jit
def settle_copied(dest_x, dest_id, n, key, inv_temp, max_s, carry, target, N: tl.constexpr):
    """The threshold among `n` (<= N) copied tokens, `carry` the mass above them -> (best
    s + g at or above it, its lowest id)."""
    i = tl.arange(0, N)
    live = i < n
    x = tl.load(dest_x + i, mask=live, other=0, cache_modifier=".cg").to(tl.float32, bitcast=True)
    ids = tl.load(dest_id + i, mask=live, other=0, cache_modifier=".cg") & ID_BITS
    s = x * inv_temp
    thr = mass_threshold(s, live, carry, max_s, target)
    z = tl.where(live & (s >= thr), s + rng.gumbel(key, ids), float("-inf"))
    top_z = tl.max(z, axis=0)
    return top_z, tl.min(tl.where(z == top_z, ids, _NO_ID), axis=0)
