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
(`capture_above_floors`).

A program that streams several chunks of a row (`grid.SPLITS_PER_PROGRAM`) does all of this
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

from graphshard.sample.rows import key_to_float, load_masked, order_key, second_tile
from graphshard.sample.workspace import HOT_LANES, HOT_TILE

DISALLOWED = tl.constexpr(-2147483648)  # bit 31 of a pool id
ID_BITS = tl.constexpr(0x7FFFFFFF)
# Pivots of a chunk's one-pass floor refinement (`refine_floor`). On an H200 (BENCHMARKS.md,
# V = 152064 fp32) 32 kept more top-k pools under the finish's one-tile sort but made every
# capture scan 7-9 % slower from batch 256 up; with the draw's two-tile sort (pools of up to
# 2048 entries) 16 is within 2 % of 32 at batch 256 for top-k rows (4 % slower with logprobs
# too) and 3-8 % faster at 1024.
FLOOR_PIVOTS = tl.constexpr(16)
# Adjacent lanes a scan thread holds (1024 lanes over 8 warps, 512 over 4:
# `grid.scan_options`): folds and prefix sums over groups of them stay within a thread. (A
# smaller tile, below 512 columns of vocabulary, only pays a layout change.)
THREAD_LANES = tl.constexpr(4)
# Tiles of the hot-lane capture smaller than HOT_TILE, for programs with few hot lanes.
HOT_FEW = tl.constexpr(32)
HOT_SOME = tl.constexpr(128)
# Lane maxima a chunk folds its tiles into before picking its capture floor.
FLOOR_LANES = 1024
# Lanes of the cheaper floor search for needs up to a quarter of them (small top-k, logprobs).
SMALL_FLOOR_LANES = 256
# Key digits a capture floor is resolved to: FLOOR_PASSES passes of FLOOR_RADIX_BITS bits, 16
# bits (sign, exponent, 7 mantissa bits), put the floor within 1% of the exact order statistic.
FLOOR_PASSES = tl.constexpr(4)
FLOOR_RADIX_BITS = tl.constexpr(4)


# Sizes the kernels derive from their constexprs (plain Python, run when a kernel compiles).
@triton.constexpr_function
def floor_lanes(block):
    return min(FLOOR_LANES, block)


@triton.constexpr_function
def small_floor_lanes(block):
    return min(SMALL_FLOOR_LANES, floor_lanes(block))


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


@triton.jit
def capture_above_floors(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot,
                          lane_x, lane_r, need_s, need_r, VOCAB: tl.constexpr,
                          CHUNK: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
                          HAS_BITMASK: tl.constexpr, GROUP: tl.constexpr):
    """Capture the candidates of GROUP chunks from `lo` for top-k, top-p and logprobs rows ->
    (floor_s, floor_r): allowed tokens with a logit below floor_s, and tokens with a raw logit
    below floor_r, were left out."""
    LANES: tl.constexpr = floor_lanes(BLOCK)
    SMALL_LANES: tl.constexpr = small_floor_lanes(BLOCK)
    separate = False
    if HAS_BITMASK:
        separate = mask_on
    if separate:
        floor_s = tl.where(need_s > 0, _lane_floor(lane_x, need_s, BLOCK, LANES, SMALL_LANES),
                           float("inf"))
        floor_r = tl.where(need_r > 0, _lane_floor(lane_r, need_r, BLOCK, LANES, SMALL_LANES),
                           float("inf"))
    else:
        # The row's chunks share one cut: each captures above the largest floor published so
        # far, and a chunk that starts after another has published refines that cut in one pass
        # instead of searching (`refine_floor`). Every answer is checked against the largest
        # floor, so nothing below it was of use anyway. A small need (logprobs, a top-k of up
        # to 64) keeps the published cut as it is, with nothing new to publish: the few more
        # candidates it leaves cost the finish less than the refinement's pivot counts cost
        # every program (BENCHMARKS.md).
        need = tl.maximum(need_s, need_r)
        low = published_cut(fill)
        if (low > float("-inf")) & (need * 4 <= SMALL_LANES):
            floor_s = low
        elif low > float("-inf"):
            floor_s = share_floor(fill, refine_floor(lane_x, need, low, tl.max(lane_x, axis=0)))
        else:
            floor_s = share_floor(fill, _lane_floor(lane_x, need, BLOCK, LANES, SMALL_LANES))
        floor_r = floor_s
    capture_hot(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot, lane_x, lane_r,
                1.0, floor_s, floor_r, VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK, GROUP)
    return floor_s, floor_r


@triton.jit
def _lane_floor(lane_max, need, BLOCK: tl.constexpr, LANES: tl.constexpr,
                SMALL_LANES: tl.constexpr):
    """`chunk_floor` over the lane maxima folded to LANES, or to SMALL_LANES when `need` is
    small: a quarter of the search for a somewhat lower floor."""
    if need * 4 <= SMALL_LANES:
        floor = chunk_floor(fold_lanes(lane_max, BLOCK, SMALL_LANES), need, SMALL_LANES,
                            FLOOR_PASSES, FLOOR_RADIX_BITS)
    else:
        floor = chunk_floor(fold_lanes(lane_max, BLOCK, LANES), need, LANES, FLOOR_PASSES,
                            FLOOR_RADIX_BITS)
    return floor


@triton.jit
def list_hot(hot_list, hot, BLOCK: tl.constexpr):
    """Store the ids of the `hot` lanes [BLOCK] at `hot_list`, in lane order. Positions come
    from a prefix sum over threads (THREAD_LANES adjacent lanes each, as the scan's layout
    holds them) plus one within a thread: a prefix sum over all the lanes first moved them
    between threads through shared memory, for ~3x the instructions (sm_90a)."""
    GROUPS: tl.constexpr = BLOCK // THREAD_LANES
    flags = tl.reshape(hot.to(tl.int32), [GROUPS, THREAD_LANES])
    per_thread = tl.sum(flags, axis=1)  # [GROUPS]
    pos = (tl.cumsum(per_thread, axis=0) - per_thread)[:, None] + tl.cumsum(flags, axis=1) - flags
    lanes = tl.reshape(tl.arange(0, BLOCK), [GROUPS, THREAD_LANES])
    tl.store(hot_list + pos, lanes, mask=flags != 0)


@triton.jit
def capture_hot(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot_list, lane_x,
                lane_r, scale, cut_s, cut_r, VOCAB: tl.constexpr, CHUNK: tl.constexpr,
                CAP: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr,
                GROUP: tl.constexpr):
    """Capture the tokens of GROUP chunks from `lo` at or above the cuts (allowed ones whose
    `logit * scale` reaches `cut_s`, any whose logit reaches `cut_r`) into the row's pool. Only
    lanes whose maximum reaches a cut can hold such a token, and few do. Up to HOT_LANES of them
    are listed (in `hot_list`, the program's scratch [HOT_LANES]) and read again in one or two
    loads per chunk; more are read tile by tile, the cold lanes loading nothing. The last
    program of a row may have fewer than GROUP chunks: the missing ones' columns lie past the
    vocabulary and read as padding."""
    hot = (lane_x * scale >= cut_s) | (lane_r >= cut_r)  # [BLOCK]
    lanes = tl.arange(0, BLOCK)
    num_hot = tl.sum(hot.to(tl.int32), axis=0)
    if num_hot <= HOT_LANES:
        # A tile-by-tile pass costs every lane, hot or cold, its instructions; listing the hot
        # lanes first costs one prefix sum. The listed lanes are read in a tile sized to their
        # number: every slot of a tile costs its instructions, listed or not, and a row that
        # needs a few candidates (logprobs, a small top-k) leaves a few lanes hot.
        list_hot(hot_list, hot, BLOCK)
        tl.debug_barrier()
        if num_hot <= HOT_FEW:
            capture_listed(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot_list,
                           num_hot, scale, cut_s, cut_r, VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK,
                           GROUP, HOT_FEW)
        elif num_hot <= HOT_SOME:
            capture_listed(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot_list,
                           num_hot, scale, cut_s, cut_r, VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK,
                           GROUP, HOT_SOME)
        else:
            capture_listed(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot_list,
                           num_hot, scale, cut_s, cut_r, VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK,
                           GROUP, HOT_TILE)
            if num_hot > HOT_TILE:
                capture_listed(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id,
                               hot_list + HOT_TILE, num_hot - HOT_TILE, scale, cut_s, cut_r,
                               VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK, GROUP,
                               HOT_LANES - HOT_TILE)
    else:
        for c in tl.static_range(GROUP):
            for start in range(0, CHUNK, 2 * BLOCK):
                # A cold lane's column reads as padding: nothing loaded, nothing taken.
                offs_a = lo + c * CHUNK + start + lanes
                offs_b = second_tile(offs_a, CHUNK, VOCAB, BLOCK)
                _, _, raw_a, allowed_a = load_masked(row_ptr, mask_row_ptr, mask_on,
                                                     tl.where(hot, offs_a, VOCAB), VOCAB,
                                                     HAS_BITMASK)
                _, _, raw_b, allowed_b = load_masked(row_ptr, mask_row_ptr, mask_on,
                                                     tl.where(hot, offs_b, VOCAB), VOCAB,
                                                     HAS_BITMASK)
                _capture_cut(pool_x, pool_id, fill, raw_a, allowed_a, offs_a, scale, cut_s,
                             cut_r, CAP)
                _capture_cut(pool_x, pool_id, fill, raw_b, allowed_b, offs_b, scale, cut_s,
                             cut_r, CAP)


@triton.jit
def capture_listed(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot_list, num,
                   scale, cut_s, cut_r, VOCAB: tl.constexpr, CHUNK: tl.constexpr,
                   CAP: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr,
                   GROUP: tl.constexpr, SLOTS: tl.constexpr):
    """`capture_hot` of the first `num` (<= SLOTS, or more: the rest are left) lanes listed at
    `hot_list`: each chunk's columns of those lanes in one load."""
    TILES: tl.constexpr = CHUNK // BLOCK
    slot = tl.arange(0, SLOTS)
    listed = slot < num
    ids = tl.load(hot_list + slot, mask=listed, other=0, cache_modifier=".cg")  # [SLOTS]
    cols = tl.arange(0, TILES)[:, None] * BLOCK + ids[None, :]  # [TILES, SLOTS]
    for c in tl.static_range(GROUP):
        offs = lo + c * CHUNK + cols
        _, _, raw, allowed = load_masked(row_ptr, mask_row_ptr, mask_on,
                                         tl.where(listed[None, :], offs, VOCAB), VOCAB,
                                         HAS_BITMASK)
        _capture_cut(pool_x, pool_id, fill, raw, allowed, offs, scale, cut_s, cut_r, CAP)


@triton.jit
def _capture_cut(pool_x, pool_id, fill, raw, allowed, offs, scale, cut_s, cut_r,
                 CAP: tl.constexpr):
    take = (raw > float("-inf")) & ((allowed & (raw * scale >= cut_s)) | (raw >= cut_r))
    capture(pool_x, pool_id, fill, raw, allowed, offs, take, CAP)
