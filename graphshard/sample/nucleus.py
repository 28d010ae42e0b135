"""Triton device functions of the split nucleus draw: the top-p threshold and draw of a large pool
settled by several programs of the per-request kernel at once (small batches).

One program settling a top-p row whose pool holds thousands of entries passes over it four times
(pivot masses, the threshold's interval, its sort, the draw), each pass waiting on a tile's loads
and on block-wide reductions, tile after tile (BENCHMARKS.md: ~25 µs at batch 1 on an H200). Here
the row's programs take a slice of SLICE pool entries each:
1. `weigh_slice`, in every program with a slice: the mass, count and Gumbel-max winner of its
   entries in each interval between two of the pivots of `knot_pivots`, stored to the
   row's scratch, and the slice reordered in place by interval (pool order is free: every answer
   from the pool breaks ties by id), so that an interval's entries lie together.
2. `settle_split`, in the last program to arrive: the summed masses say which interval holds the
   threshold; its entries (at most SHORT_POOL) are gathered from the slices and sorted, which gives
   the threshold, and the token is the best of the interval's Gumbel scores above it and of the
   winners of the intervals above it. When the best winner above the interval beats every
   Gumbel score in it, that is the token whatever the threshold (every score above the interval
   is in the nucleus), and the gather and sort are skipped: at 152064 fp32, temperature 0.8, top-p
   0.9, 47 of 48 rows (BENCHMARKS.md, "The interval shortcut in the split finish").
The answer is `candidates.search_mass`'s threshold and `candidates.draw_pool`'s token.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from graphshard.sample import rng
from graphshard.sample.candidates import (PIVOTS, SHORT_POOL, STAT_WORDS, floor_score,
                                          mass_above, mass_pivots, mass_threshold)
from graphshard.sample.floors import ID_BITS
from graphshard.sample.deep import no_interval
from graphshard.sample.deep_split import (best_cell, first_interval, first_pivots, weigh_span,
                                          winner_below)
from graphshard.sample.resolve import load_part, softmax_mass
from graphshard.sample.workspace import (P_FLOOR_S, P_MAX_X, P_SUM_S, STAT_DEEP_SPLIT, STAT_SPLIT,
                                          STAT_SPLIT_BEATEN, padded)

# The most programs a row's finish may have (a power of two: the last program loads every
# program's results as one [MAX_PROGRAMS, PIVOTS] block).
MAX_PROGRAMS = tl.constexpr(16)
_NO_ID = tl.constexpr(2147483647)
# The row's pool count word (`fill`) doubles as the finish programs' arrival counter and
# their one shared decision: the low COUNT_BITS hold the count the scan left, each program adds
# OPENED when it reads it and (with a slice or a span) WEIGHED when its part is weighed, and
# DECIDED, with WIDE or not, records whether the row's programs weigh its row (`agree_wide`).
# The program that completes the count resets the word for the next launch. _ARRIVAL_BITS (five)
# count up to MAX_PROGRAMS arrivals of each kind: OPENED's above the count, WEIGHED's above
# those, then DECIDED and WIDE.
COUNT_BITS = tl.constexpr(20)
_ARRIVAL_BITS = tl.constexpr(5)
_COUNT_MASK = tl.constexpr((1 << COUNT_BITS.value) - 1)
_OPENED_SHIFT = tl.constexpr(COUNT_BITS.value)
_WEIGHED_SHIFT = tl.constexpr(_OPENED_SHIFT.value + _ARRIVAL_BITS.value)
_OPENED = tl.constexpr(1 << _OPENED_SHIFT.value)
_WEIGHED = tl.constexpr(1 << _WEIGHED_SHIFT.value)
_ARRIVALS = tl.constexpr((1 << _ARRIVAL_BITS.value) - 1)
_NOT_OPENED = tl.constexpr(~(_ARRIVALS.value << _OPENED_SHIFT.value))
DECIDED = tl.constexpr(1 << (_WEIGHED_SHIFT.value + _ARRIVAL_BITS.value))
WIDE = tl.constexpr(-(1 << 31))  # bit 31 of the int32 word


@triton.jit
def close_pool(fill):
    """The row's last use of its pool count: the next launch captures into an empty pool, with
    no shared floor."""
    tl.store(fill, 0)
    tl.store(fill + 1, 0)


@triton.jit
def split_nucleus(fill, part, pool_x, pool_id, stats_ptr, counters, row, VOCAB: tl.constexpr,
                  SPLITS: tl.constexpr, PROGRAMS: tl.constexpr, SLICE: tl.constexpr,
                  CAP: tl.constexpr, TILE: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """A row's finish over PROGRAMS programs -> (pool count, whether this program settles the
    row, the draw made here for `resolve.settle_token`: (used, drawn, token, the deep draw's
    first interval)).

    For a top-p row without top-k and min-p (the caller checks); `row` as `settle_token` takes
    it. One whose nucleus reaches below a whole pool and whose unfiltered winner lies at or
    below the pool's floor is weighed over its row by all its programs (`deep_split`); one
    whose pool spans 2 to PROGRAMS slices, with a finite floor below a finite maximum (the
    pivots' interval), is drawn by its slices' programs; the last of them settles the row. Any
    other row is settled by its first program. `stats_ptr`: the row's scratch of PROGRAMS *
    STAT_WORDS words; `counters`: the workspace's stats."""
    row_ptr, mask_row_ptr, mask_on, key, inv_temp, _k, top_p, _m, _n, _r, _f = row
    q = tl.program_id(1)
    seen = tl.atomic_add(fill, _OPENED, sem="relaxed", scope="gpu") + _OPENED
    n_pool = seen & _COUNT_MASK
    active = tl.zeros((), tl.int32)
    settles = q == 0
    used = q < 0
    drawn = q < 0
    token = tl.zeros((), tl.int32)
    first = no_interval()
    max_x = tl.max(load_part(part, P_MAX_X, SPLITS, float("-inf"), True), axis=0)
    max_s = max_x * inv_temp
    floor_x = tl.max(load_part(part, P_FLOOR_S, SPLITS, float("-inf"), True), axis=0)
    lo = floor_score(floor_x, inv_temp)  # the best score an uncaptured token can have
    spread = max_s - lo
    if (max_x > float("-inf")) & (lo > float("-inf")) & (spread >= 0.0) \
            & (spread < float("inf")):
        target = top_p * softmax_mass(part, P_MAX_X, P_SUM_S, max_s, inv_temp, SPLITS)
        wide = (n_pool <= CAP) & (n_pool > 0)
        if wide:
            wide = winner_below(row_ptr, part, inv_temp, lo, VOCAB, SPLITS)
        if wide:
            # Whether the pool falls short of the target is read off the pool, which a slice's
            # program reorders as soon as it knows: the row's programs take one answer.
            word = seen
            if (word & DECIDED) == 0:
                short = mass_above(pool_x, pool_id, n_pool, inv_temp, max_s, lo, CAP, TILE) \
                    < target
                word = agree_wide(fill, word, short, PROGRAMS)
            wide = (word & WIDE) != 0
        if wide:
            active = PROGRAMS
            settles = q < 0
            pivots = first_pivots(pool_x, pool_id, n_pool, inv_temp, lo, CAP, TILE)
            weigh_span(row_ptr, mask_row_ptr, mask_on, q, VOCAB, key, inv_temp, max_s, pivots,
                       stats_ptr, PROGRAMS, HAS_BITMASK)
            after = _arrive(fill, active, PROGRAMS)
            if _weighed(after) == active:
                settles = q >= 0
                drawn, token, first = first_interval(stats_ptr, pivots, target, PROGRAMS)
                used = first[0]
                if used:
                    tl.atomic_add(counters + STAT_DEEP_SPLIT, 1, sem="relaxed")
        elif (n_pool > SLICE) & (n_pool <= PROGRAMS * SLICE):
            active = (n_pool + SLICE - 1) // SLICE
            settles = q < 0
            if q < active:
                pivots = knot_pivots(part, lo, spread, inv_temp, n_pool, SPLITS)
                weigh_slice(pool_x, pool_id, n_pool, q, inv_temp, max_s, lo, pivots, key,
                            stats_ptr, SLICE)
                after = _arrive(fill, active, PROGRAMS)
                if _weighed(after) == active:
                    settles = q >= 0
                    used, thr, token, beaten = settle_split(pool_x, pool_id, stats_ptr, active,
                                                            pivots, inv_temp, max_s, target, key,
                                                            SLICE)
                    drawn = used & (thr > lo)
                    if used:
                        tl.atomic_add(counters + STAT_SPLIT, 1, sem="relaxed")
                    if beaten:
                        tl.atomic_add(counters + STAT_SPLIT_BEATEN, 1, sem="relaxed")
    _count_in(fill, seen, active, PROGRAMS)
    return n_pool, settles, (used, drawn, token, first)


@triton.jit
def _arrive(fill, active, PROGRAMS: tl.constexpr):
    """Count this program's results in (they are stored, from every thread) -> the pool word
    after this program's add."""
    tl.debug_barrier()  # the results' stores come from every thread of the program
    after = tl.atomic_add(fill, _WEIGHED, sem="acq_rel", scope="gpu") + _WEIGHED
    tl.debug_barrier()
    _count_in(fill, after, active, PROGRAMS)
    return after


@triton.constexpr_function
def knot_rank(splits):
    """Which of a row's chunk maxima, largest first, anchors the pivots' count curve (-1: none,
    too few chunks for a rank that says more than the row maximum does)."""
    return splits - 3 if splits >= 8 else -1


@triton.constexpr_function
def knot_count(splits):
    """How many of a row's scores lie above its `knot_rank`-th chunk maximum, expected when each
    of its `splits` chunks is as likely to hold a large score: 38.5 at 19 chunks."""
    return -splits * math.log(1.0 - (knot_rank(splits) + 0.5) / splits)


@triton.jit
def knot_pivots(part, lo, spread, inv_temp, n_pool, SPLITS: tl.constexpr):
    """The pivots over a pool of `n_pool` scores from `lo`, at equal counts on a count curve
    through (lo, n_pool) and a knot taken from the row's chunk maxima [PIVOTS].

    `mass_pivots` draws the curve from the floor to the row maximum, counted once. The maximum
    is one draw from the far end of the tail: a Gaussian-like tail puts its top pivots too low
    (300 entries in the top interval where 150 were meant), a heavy one its bottom pivots too
    high (over a thousand in one interval), and a threshold in such an interval is searched
    over the whole pool. The `knot_rank`-th largest chunk maximum has `knot_count` of the
    row's scores above it: a point inside the pool's range, drawn from many chunks. Without a
    knot (few chunks, or one outside the pool's range) they are those of `mass_pivots`."""
    KNOT: tl.constexpr = knot_rank(SPLITS)
    pivots = mass_pivots(lo, spread, n_pool)
    if KNOT >= 0:
        maxima = load_part(part, P_MAX_X, SPLITS, float("-inf"), True)  # [padded(SPLITS)]
        at = tl.arange(0, padded(SPLITS))
        # Each maximum's rank, largest first (ties by chunk): the one at rank KNOT is the knot.
        rank = tl.sum(((maxima[None, :] > maxima[:, None])
                       | ((maxima[None, :] == maxima[:, None]) & (at[None, :] < at[:, None])))
                      .to(tl.int32), axis=1)
        knot = tl.max(tl.where(rank == KNOT, maxima, float("-inf")), axis=0) * inv_temp
        n = n_pool.to(tl.float32)
        n_knot = knot_count(SPLITS)
        above = n * (1.0 - tl.arange(0, PIVOTS).to(tl.float32) / PIVOTS)  # entries >= each pivot
        fits = (knot > lo) & (knot < float("inf")) & (n > n_knot)
        pivots = tl.where(fits, lo + (knot - lo) * (tl.log(n / above) / tl.log(n / n_knot)),
                          pivots)
    return pivots


@triton.jit
def _count_in(fill, seen, active, PROGRAMS: tl.constexpr):
    """Reset the pool word when `seen`, its value after one of the row's atomic adds, holds
    every program's OPENED and `active` WEIGHED: no program of the row reads it again."""
    if (_opened(seen) == PROGRAMS) & (_weighed(seen) == active):
        close_pool(fill)


@triton.jit
def _opened(word):
    """The OPENED arrivals a pool word holds."""
    return (word >> _OPENED_SHIFT) & _ARRIVALS


@triton.jit
def _weighed(word):
    """The WEIGHED arrivals a pool word holds."""
    return (word >> _WEIGHED_SHIFT) & _ARRIVALS


@triton.jit
def agree_wide(fill, word, wide, PROGRAMS: tl.constexpr):
    """Publish `wide`, this program's answer, as the row's unless another program published
    first -> the pool word holding the row's answer (DECIDED set; WIDE set when wide). `word`:
    the pool word as this program last read it. A compare-and-swap from that word with every
    one of the row's PROGRAMS programs opened: they open as they start, before any has summed
    the pool, so the first swap of the first program to sum finds the word it expects; with
    the word as this program read it, that swap would fail on every later opening and take a
    second round trip. A failed swap returns the word as it now is, and another arrival
    (OPENED) only changes the counts, so the loop ends within the row's programs' arrivals. No
    program waits on another's progress.

    A swap that finds no arrival at all finds the word reset (`_count_in`): every program
    opened and every program with a part arrived before this one decided, so the row's answer
    was not wide (a wide row waits for all its programs' parts) and this program has no slice.
    It takes that answer and writes nothing: a swap into the reset word would leave DECIDED
    in it for the next launch, whose captures would land past the pool and whose programs
    would take this launch's answer."""
    flag = DECIDED | tl.where(wide, WIDE, 0)
    expect = (word & _NOT_OPENED) | (PROGRAMS * _OPENED)
    while (word & DECIDED) == 0:
        old = tl.atomic_cas(fill, expect, expect | flag, sem="acq_rel", scope="gpu")
        reset = _opened(old) == 0
        word = tl.where(old == expect, expect | flag, tl.where(reset, DECIDED, old))
        expect = old
    return word


@triton.jit
def weigh_slice(pool_x_ptr, pool_id_ptr, n_cand, q, inv_temp, max_s, lo, pivots, key, stats_ptr,
                SLICE: tl.constexpr):
    """Program `q`'s part: weigh, race and reorder pool entries [q * SLICE, (q + 1) * SLICE). An
    entry counts when it is allowed with a finite score s >= lo (= pivots[0]); its interval is
    the last pivot at or below s, so the entries at or above pivot k are those of intervals >= k.
    Counted entries go first, by interval, the rest after them."""
    at = tl.arange(0, PIVOTS)
    i = q * SLICE + tl.arange(0, SLICE)
    live = i < n_cand
    x = tl.load(pool_x_ptr + i, mask=live, other=0xFF800000, cache_modifier=".cg")  # logit bits
    ids = tl.load(pool_id_ptr + i, mask=live, other=0, cache_modifier=".cg")
    s = tl.where(live & (ids >= 0), x.to(tl.float32, bitcast=True) * inv_temp, float("-inf"))
    counted = (s > float("-inf")) & (s >= lo)
    interval = tl.sum((s[None, :] >= pivots[:, None]).to(tl.int32), axis=0) - 1  # [SLICE]
    interval = tl.where(counted, interval, PIVOTS)
    w = tl.where(counted, tl.exp(s - max_s), 0.0)
    z = tl.where(counted, s + rng.gumbel(key, ids & ID_BITS), float("-inf"))
    member = interval[None, :] == at[:, None]  # [PIVOTS, SLICE]
    mass = tl.sum(tl.where(member, w[None, :], 0.0), axis=1)
    count = tl.sum(member.to(tl.int32), axis=1)
    best_z = tl.max(tl.where(member, z[None, :], float("-inf")), axis=1)
    best_id = tl.min(tl.where(member & (z[None, :] == best_z[:, None]), (ids & ID_BITS)[None, :],
                              _NO_ID), axis=1)
    # Where each entry goes: its interval's start plus its rank within the interval.
    start = tl.cumsum(count, axis=0) - count  # [PIVOTS]
    rank = tl.cumsum(member.to(tl.int32), axis=1) - 1  # [PIVOTS, SLICE]
    pos = tl.sum(tl.where(member, start[:, None] + rank, 0), axis=0)
    rest = tl.sum(count, axis=0) + tl.cumsum((live & ~counted).to(tl.int32), axis=0) - 1
    pos = q * SLICE + tl.where(counted, pos, rest)
    tl.debug_barrier()  # every entry of the slice is loaded before any is overwritten
    tl.store(pool_x_ptr + pos, x, mask=live)
    tl.store(pool_id_ptr + pos, ids, mask=live)
    base = stats_ptr + q * STAT_WORDS
    tl.store(base + at, mass.to(tl.int32, bitcast=True))
    tl.store(base + PIVOTS + at, count)
    tl.store(base + 2 * PIVOTS + at, best_z.to(tl.int32, bitcast=True))
    tl.store(base + 3 * PIVOTS + at, best_id)


@triton.jit
def settle_split(pool_x_ptr, pool_id_ptr, stats_ptr, active, pivots, inv_temp, max_s, target,
                 key, SLICE: tl.constexpr):
    """The last program's part, once `active` programs have weighed their slices at `pivots`
    -> (settled, threshold, token, beaten). Not settled when the interval that holds the
    threshold has more than SHORT_POOL entries (the caller searches the whole pool). A
    threshold of -inf: the counted mass does not reach `target` (the pool cannot prove the
    threshold). `beaten`: the best Gumbel score above the threshold's interval beats every one
    in it, so that score's token is the answer whatever the threshold in the interval, and no
    gather or sort runs; the threshold returned is then the interval's lower pivot, a lower
    bound of it, which tells the caller whether the pool settled the row."""
    at = tl.arange(0, PIVOTS)
    progs = tl.arange(0, MAX_PROGRAMS)
    cell = stats_ptr + progs[:, None] * STAT_WORDS + at[None, :]  # [MAX_PROGRAMS, PIVOTS]
    here = (progs[:, None] < active) & (at[None, :] >= 0)
    mass = tl.load(cell, mask=here, other=0, cache_modifier=".cg").to(tl.float32, bitcast=True)
    count = tl.load(cell + PIVOTS, mask=here, other=0, cache_modifier=".cg")
    best_z = tl.load(cell + 2 * PIVOTS, mask=here, other=0xFF800000,
                     cache_modifier=".cg").to(tl.float32, bitcast=True)
    best_id = tl.load(cell + 3 * PIVOTS, mask=here, other=_NO_ID, cache_modifier=".cg")
    interval_mass = tl.sum(mass, axis=0)  # [PIVOTS]
    # The mass at or above each pivot; the threshold's interval is the last that reaches target
    # (the sums are rounded separately: take the last, not a count).
    above = tl.sum(tl.where(at[None, :] >= at[:, None], interval_mass[None, :], 0.0), axis=1)
    j = tl.max(tl.where(above >= target, at, -1), axis=0)
    settled = j < 0  # no threshold: the pool cannot prove one
    beaten = j < -1
    thr = tl.full((), float("-inf"), tl.float32)
    token = tl.full((), 0, tl.int32)
    if j >= 0:
        # Per program: interval j's entries, and where they start in its slice.
        in_j = tl.sum(tl.where(at[None, :] == j, count, 0), axis=1)  # [MAX_PROGRAMS]
        at_j = progs * SLICE + tl.sum(tl.where(at[None, :] < j, count, 0), axis=1)
        n_in = tl.sum(in_j, axis=0)
        carry = tl.sum(tl.where(at == j + 1, above, 0.0), axis=0)  # the mass above the interval
        top_z, top_id = best_cell(best_z, best_id, here & (at[None, :] > j))
        z = tl.full((), float("-inf"), tl.float32)
        z_id = tl.full((), _NO_ID, tl.int32)
        # Every score above the interval is in the nucleus. When the best of them beats the
        # interval's best (strictly: a tie would need the interval's ids), it beats those of
        # the interval's scores at or above the threshold too. The first interval starts at
        # the floor, where the threshold must be found to tell whether the pool settled it.
        in_best = best_cell(best_z, best_id, here & (at[None, :] == j))[0]
        beaten = (j > 0) & (top_z > in_best)
        # An empty interval (the separately rounded sums disagree) or one past a short sort
        # (a pool of more than ~4000 entries, or thousands of ties): the caller searches the
        # whole pool.
        settled = beaten | ((n_in > 0) & (n_in <= SHORT_POOL))
        if beaten:
            thr = tl.max(tl.where(at == j, pivots, float("-inf")), axis=0)
        elif settled:
            thr, z, z_id = _settle_interval(pool_x_ptr, pool_id_ptr, in_j, at_j, inv_temp, max_s,
                                            carry, target, key, SHORT_POOL)
        better = (z > top_z) | ((z == top_z) & (z_id < top_id))
        token = tl.where(better, z_id, top_id)
    return settled, thr, token, beaten


@triton.jit
def _settle_interval(pool_x_ptr, pool_id_ptr, in_j, at_j, inv_temp, max_s, carry, target, key,
                     N: tl.constexpr):
    """Gather the threshold's interval, `in_j` entries from `at_j` in each program's slice (the
    first N in all) -> (threshold, best Gumbel score at or above it, its lowest id)."""
    i = tl.arange(0, N)
    start = tl.cumsum(in_j, axis=0) - in_j  # [MAX_PROGRAMS]: where each slice's entries go
    mine = (i[:, None] >= start[None, :]) & (i[:, None] < (start + in_j)[None, :])  # [N, P]
    addr = tl.sum(tl.where(mine, (at_j - start)[None, :] + i[:, None], 0), axis=1)
    live = i < tl.sum(in_j, axis=0)
    x = tl.load(pool_x_ptr + addr, mask=live, other=0, cache_modifier=".cg")
    ids = tl.load(pool_id_ptr + addr, mask=live, other=0, cache_modifier=".cg") & ID_BITS
    s = x.to(tl.float32, bitcast=True) * inv_temp
    thr = mass_threshold(s, live, carry, max_s, target)
    z = tl.where(live & (s >= thr), s + rng.gumbel(key, ids), float("-inf"))
    top_z = tl.max(z, axis=0)
    return thr, top_z, tl.min(tl.where(z == top_z, ids, _NO_ID), axis=0)
