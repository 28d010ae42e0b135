"""Triton device functions of the sampler's capture step: the scan's chunk programs pick a cut
and append the tokens at or above it to their row's candidate pool (`candidates` answers from the
pool).

A chunk program finds a floor `theta` at or below its chunk's `need`-th largest logit (the
`need`-th largest of its lanes' maxima: `need` distinct elements are at least that large) and
captures every token at or above it into the row's pool. Tokens a chunk did not capture are
below its floor, so a threshold above every chunk's floor has all its kept tokens in the pool
(`candidates.floor_score`).

The chunks of a row share their floors (`share_floor`): each captures only above the largest
floor published so far and reports that cut as its floor. Every uncaptured token still lies
below the largest reported floor, which is all the finish's check uses, so nothing it could
accept is lost; and where the row needs only its own top `need` (a small top-k, a greedy row's
logprobs), a chunk's floor bounds that order statistic from below too. A chunk that starts
after others have published (at large batch most do: the grid runs a row's chunks one
batch-wide wave after another) refines the published cut with one pass over its lanes
(`refine_floor`) instead of a radix search (`chunk_floor`); where the need is small (logprobs,
a small top-k) it captures above the published cut as it is and publishes nothing
(`kernels._capture_above_floors`).

A program that streams several chunks of a row (`kernels.SPLITS_PER_PROGRAM`) does all of this
once for them, over the maxima of all their lanes, and reports its floor for each of them.

A min-p-only row needs no floor: min-p keeps `s >= max s + log(min_p)`, and the largest chunk
maximum published so far bounds the row's maximum from below, so a chunk captures every token
above that bound (with the finish's rounding) and reports a floor of -inf: nothing a threshold
can keep was left out.

Pool entries are (logit bits, id with bit 31 set when the bitmask disallows the token).
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample.rows import key_to_float, order_key

DISALLOWED = tl.constexpr(-2147483648)  # bit 31 of a pool id
ID_BITS = tl.constexpr(0x7FFFFFFF)
# Pivots of a chunk's one-pass floor refinement (`refine_floor`). On an H200 (BENCHMARKS.md,
# V = 152064 fp32) 32 kept more top-k pools under the finish's one-tile sort but made every
# capture scan 7-9 % slower from batch 256 up; with the draw's two-tile sort (pools of up to
# 2048 entries) 16 is within 2 % of 32 at batch 256 for top-k rows (4 % slower with logprobs
# too) and 3-8 % faster at 1024.
FLOOR_PIVOTS = tl.constexpr(16)


@triton.jit
def chunk_floor(lane_max, need, LANES: tl.constexpr, PASSES: tl.constexpr,
                RADIX_BITS: tl.constexpr):
    """A lower bound of the `need`-th largest of `lane_max` [LANES] (so of the chunk's `need`-th
    largest value: `need` distinct elements are at least that large); -inf when need > LANES.

    A radix search over the order-preserving keys stopped after PASSES digits: the prefix found
    so far always has `need` keys at or above it, and zeroing the undecided bits only lowers it.
    A sort would give the exact value, but costs more than the few extra captures saved."""
    RADIX: tl.constexpr = 2**RADIX_BITS
    keys = order_key(lane_max)
    digits = tl.arange(0, RADIX).to(tl.uint32)
    prefix = tl.full((), 0, tl.uint32)
    # A loop, not unrolled: a program runs this code once, and at small batch waiting for
    # instructions to be fetched was the main stall of the scan (Nsight Compute, BENCHMARKS.md);
    # a loop fetches one pass's code.
    for p in range(PASSES):
        shift = 32 - RADIX_BITS * (p + 1)
        cand = prefix | (digits << shift)  # [RADIX]
        counts = tl.sum((keys[None, :] >= cand[:, None]).to(tl.int32), axis=1)
        digit = tl.maximum(tl.sum((counts >= need).to(tl.int32), axis=0) - 1, 0)
        prefix = prefix | (digit.to(tl.uint32) << shift)
    # Below the key of -inf lie only NaN patterns: every lane max is at least -inf.
    theta = key_to_float(tl.maximum(prefix, order_key(tl.full((), float("-inf"), tl.float32))))
    return tl.where(need <= LANES, theta, float("-inf"))


@triton.jit
def refine_floor(lane_max, need, low, top):
    """`chunk_floor` for a chunk whose row has already published a cut `low` (finite;
    `published_cut`): the largest of FLOOR_PIVOTS values spread evenly over [low, top] (`top`
    the largest lane maximum) that `need` lanes reach, else `low`. One pass where the radix
    search takes PASSES: the earlier chunks already put the answer near `low`."""
    step = (top - low) / FLOOR_PIVOTS
    pivots = low + step * tl.arange(0, FLOOR_PIVOTS).to(tl.float32)  # [FLOOR_PIVOTS]
    above = tl.sum((lane_max[None, :] >= pivots[:, None]).to(tl.int32), axis=1)
    # Pivots rise and counts fall: the reached pivots are a prefix. Recomputing the last one
    # (the same two roundings) keeps the pivots out of registers past the compare.
    reached = tl.sum((above >= need).to(tl.int32), axis=0)
    best = low + step * tl.maximum(reached - 1, 0).to(tl.float32)
    # A chunk whose lanes all lie below `low`, or with +inf among them, keeps `low`.
    return tl.where((step >= 0.0) & (step < float("inf")), best, low)


@triton.jit
def fold_lanes(lane_max, BLOCK: tl.constexpr, LANES: tl.constexpr):
    """[BLOCK] per-lane maxima -> [LANES] (LANES divides BLOCK): a cheaper floor search. Each
    folded lane is the maximum of BLOCK // LANES adjacent lanes, which the scan's layout keeps in
    one thread (a thread holds four adjacent lanes), so the fold moves no data between threads."""
    if BLOCK == LANES:
        return lane_max
    return tl.max(tl.reshape(lane_max, [LANES, BLOCK // LANES]), axis=1)


@triton.jit
def capture(pool_x_ptr, pool_id_ptr, count_ptr, x_raw, allowed, offs, take, CAP: tl.constexpr):
    """Append the tokens `take` marks to the row's pool, one atomic per taken token (a tile
    takes few, and a prefix sum over the tile would cost every tile a block-wide scan);
    entries past CAP are dropped (the caller sees the count exceed CAP)."""
    pos = tl.atomic_add(count_ptr + tl.zeros_like(offs), 1, mask=take, sem="relaxed")
    keep = take & (pos >= 0) & (pos < CAP)
    tl.store(pool_x_ptr + pos, x_raw.to(tl.int32, bitcast=True), mask=keep)
    ids = tl.where(allowed, offs, offs | DISALLOWED)
    tl.store(pool_id_ptr + pos, ids, mask=keep)


@triton.jit
def share_floor(fill_ptr, floor_x):
    """Publish a chunk value that bounds one of the row's own order statistics from below (a
    floor for the row's `need`-th largest, or the chunk maximum for the row's maximum) and
    return the largest value published so far (kept as an order key in the word after the pool
    fill). Every such value lies at or below that statistic, so the row's pool needs nothing
    below their maximum."""
    own = order_key(floor_x)
    shared = (fill_ptr + 1).to(tl.pointer_type(tl.uint32))
    return key_to_float(tl.maximum(tl.atomic_max(shared, own, sem="relaxed"), own))


@triton.jit
def published_cut(fill_ptr):
    """The largest floor the row's chunks have published so far (`share_floor`), NaN when none
    has. Read with an atomic: a scalar atomic runs once and hands every thread of the program
    its result, where a plain load runs in every thread and another program's publish can land
    between those loads; threads that disagree on the cut would mix pivots of two searches."""
    shared = (fill_ptr + 1).to(tl.pointer_type(tl.uint32))
    return key_to_float(tl.atomic_or(shared, 0, sem="relaxed"))
