"""Triton device functions of the sampler's candidate path: answer top-k, top-p, min-p and
logprobs exactly from a row's pool of captured tokens (`floors`), or say that they cannot.

Tokens a chunk did not capture lie below its floor: `floor_score` turns the largest floor into
the largest score an uncaptured token can have, and each answer below is exact when its
threshold lies above that score (the caller checks).

Answers that need only the pool's top `num` entries (a top-k of up to SHORT_POOL with whatever
follows it, the top-K logprobs) first copy those behind the pool (`select_above`: one pass counts
the entries above 16 pivots, one copies the entries above the highest pivot `num` of them reach)
and work on the copy, which sorts in a fraction of the time of the whole pool; the sorts'
instruction count is what a small batch waits on. A pool, or copy, that fits one tile is sorted
once (`sorted_thresholds`, `top_raw`); so are the draw's thresholds of a pool that fits two
(`resolve.draw_from_pool`). In a larger one the top-p threshold is found by pivots
(`search_mass`), a top-k threshold a radix digit per pass (`search_pool`), and the top-K
logprobs by a running top-K over its tiles (`top_raw`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample import rng
from graphshard.sample.floors import DISALLOWED, ID_BITS
from graphshard.sample.rows import key_to_float, max_lowest, merge_top, order_key

# Pools this short (a small top-k or logprobs list above a shared floor) sort in a quarter of
# the time of a whole tile.
SHORT_POOL = tl.constexpr(256)
# The nucleus search (`search_mass`): pivots of its first pass, and the most entries between
# two pivots it sorts (it uses that much of the pool's unused tail as scratch).
PIVOTS = tl.constexpr(16)
# Scratch words per program of a row's finish split over several programs (`nucleus`,
# `deep_split`): per interval between two pivots its mass, count, best Gumbel score and its id.
STAT_WORDS = tl.constexpr(4 * PIVOTS)
SORT_LIMIT = tl.constexpr(1024)
# Pools this short take a sort of 64 entries. (Cutting larger pools down to it with
# `select_above` was timed on an H200 and did not pay: BENCHMARKS.md.)
TINY_POOL = tl.constexpr(64)
# Pivots of `select_above`'s counting pass.
SELECT_PIVOTS = tl.constexpr(16)


@triton.jit
def floor_score(floor_x, inv_temp):
    """Largest score an uncaptured token can have: uncaptured tokens lie strictly below the
    floor, so at most at the float just below it (scores round, the order does not)."""
    below = key_to_float(order_key(floor_x) - 1)
    return tl.where(floor_x == float("-inf"), float("-inf"), below * inv_temp)


@triton.jit
def load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, TILE: tl.constexpr):
    """One tile of the pool -> (score, raw logit, id, allowed & live). Scores of disallowed and
    dead entries are -inf; raw logits of dead entries are -inf."""
    i = t + tl.arange(0, TILE)
    live = i < n_cand
    x = tl.load(pool_x_ptr + i, mask=live, other=0xFF800000, cache_modifier=".cg")
    x = x.to(tl.float32, bitcast=True)
    ids = tl.load(pool_id_ptr + i, mask=live, other=0, cache_modifier=".cg")
    ok = live & (ids >= 0)
    s = tl.where(ok, x * inv_temp, float("-inf"))
    return s, tl.where(live, x, float("-inf")), ids & ID_BITS, ok


@triton.jit
def search_pool(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score, low_score, target,
                BY_MASS: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
                RADIX_BITS: tl.constexpr):
    """Largest score key T with W(captured allowed scores >= T, and >= low_score) >= target,
    decided RADIX_BITS bits per pass. W counts (top-k) or sums exp(s - max_score) (top-p).
    Returns (T as a score, W of everything counted): W below target means no such T."""
    RADIX: tl.constexpr = 2**RADIX_BITS
    digits = tl.arange(0, RADIX).to(tl.uint32)
    prefix = tl.full((), 0, tl.uint32)
    total = tl.full((), 0.0, tl.float32)
    # A loop, not unrolled: the finish's machine code is a third smaller, and on an H200 every
    # finish ran as fast or faster (BENCHMARKS.md, "Code size of the sampler, timed").
    for p in range(32 // RADIX_BITS):
        shift = 32 - RADIX_BITS * (p + 1)
        cand = prefix | (digits << shift)  # [RADIX]
        acc = tl.zeros([RADIX], tl.float32)
        for t in range(0, CAP, TILE):
            if t < n_cand:
                s, _, _, ok = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, TILE)
                ok = ok & (s > float("-inf")) & (s >= low_score)
                if BY_MASS:
                    w = tl.where(ok, tl.exp(s - max_score), 0.0)
                else:
                    w = tl.where(ok, 1.0, 0.0)
                hit = order_key(s)[None, :] >= cand[:, None]  # [RADIX, TILE]
                acc += tl.sum(tl.where(hit, w[None, :], 0.0), axis=1)
        if p == 0:
            total = tl.max(acc, axis=0)  # digit 0 of the first pass admits every key
        digit = tl.maximum(tl.sum((acc >= target).to(tl.int32), axis=0) - 1, 0)
        prefix = prefix | (digit.to(tl.uint32) << shift)
    return key_to_float(prefix), total


@triton.jit
def search_mass(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score, low_score, below, target,
                key, race, CAP: tl.constexpr, TILE: tl.constexpr, RADIX_BITS: tl.constexpr,
                RACE: tl.constexpr):
    """The top-p threshold: `search_pool` by mass, for a caller that accepts only a threshold
    above `below` (the best score an uncaptured token can have) -> (threshold, raced, token).

    One pass weighs PIVOTS scores spread over (max(below, low_score), max_score]: the
    threshold lies between the last pivot whose mass above reaches `target` and the next one. A
    second pass copies the pool entries of that interval behind the pool's live entries, and
    a sort of them with the mass above the interval gives the threshold. Three passes and a
    short sort in place of a radix search's eight passes; when the interval holds too many
    entries (thousands of ties) or the pivots cannot be spread, the radix search decides.

    With `race` (the caller draws over the scores at or above the threshold alone) the second
    pass first races the scores above the interval and those in it (`race_interval`): when
    the best Gumbel score above beats every one in the interval, its token is the draw
    whatever the threshold in the interval (`raced`), and the interval's lower pivot, a lower
    bound of the threshold, is returned with it; no copy, sort or draw pass runs. Only a
    finish compiled with RACE carries the race's code (the one-program finish, `kernels`): in
    every finish, its code and registers made rows that never race slower (BENCHMARKS.md)."""
    lo = tl.maximum(below, low_score)
    spread = max_score - lo
    # Returned when the threshold lies at or below `below`: the caller rejects it.
    thr = tl.full((), float("-inf"), tl.float32)
    raced = n_cand < 0
    token = tl.zeros((), tl.int32)
    radix = ~((lo > float("-inf")) & (spread >= 0.0) & (spread < float("inf")))
    if ~radix:
        at = tl.arange(0, PIVOTS)
        pivots = mass_pivots(lo, spread, n_cand)
        mass = tl.zeros([PIVOTS], tl.float32)
        for t in range(0, CAP, TILE):
            if t < n_cand:
                s, w = _mass_tile(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, max_score,
                                  low_score, TILE)
                mass += tl.sum(tl.where(s[None, :] >= pivots[:, None], w[None, :], 0.0), axis=1)
        j = tl.sum((mass >= target).to(tl.int32), axis=0) - 1
        if j >= 0:
            a = tl.max(tl.where(at == j, pivots, float("-inf")), axis=0)
            b = tl.min(tl.where(at == j + 1, pivots, float("inf")), axis=0)
            carry = tl.sum(tl.where(at == j + 1, mass, 0.0), axis=0)  # the mass at or above b
            # Every score at or above b is in the nucleus. The first interval starts at `lo`,
            # where the threshold must be found to tell it from `below`; the last has nothing
            # above it.
            if RACE:
                if race & (j > 0) & (j < PIVOTS - 1) & (a > lo):
                    top_z, top_id, in_z = race_interval(pool_x_ptr, pool_id_ptr, n_cand,
                                                        inv_temp, low_score, a, b, key, CAP, TILE)
                    # Strictly: a tie would need the interval's ids.
                    raced = top_z > in_z
                    token = top_id
                    thr = tl.where(raced, a, thr)
            if ~raced:
                # The interval's entries go to the pool's unused tail, as many as fit.
                scratch = pool_x_ptr + n_cand
                room = tl.minimum(CAP - n_cand, SORT_LIMIT)
                n_in = _copy_interval(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score,
                                      low_score, a, b, scratch, room, CAP, TILE)
                fits = (n_in > 0) & (n_in <= room)
                tl.debug_barrier()  # the copies came from other threads of this program
                if fits & (n_in <= SHORT_POOL):
                    thr = _sorted_mass_threshold(scratch, n_in, carry, max_score, target,
                                                 SHORT_POOL)
                elif fits:
                    thr = _sorted_mass_threshold(scratch, n_in, carry, max_score, target,
                                                 SORT_LIMIT)
                radix = ~fits
    if radix:
        thr = search_pool(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score, low_score,
                          target, True, CAP, TILE, RADIX_BITS)[0]
    return thr, raced, token


# Out of line: the one-program finish of large batches is held to few registers, and the
# race's loop inlined into it spilled more (sm_90a).
@triton.jit(noinline=True)
def race_interval(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, low_score, a, b, key,
                  CAP: tl.constexpr, TILE: tl.constexpr):
    """One pass over the pool's counted scores (allowed, finite, >= low_score) -> (the best
    s + g at or above b, its lowest id; the best s + g in [a, b))."""
    top_z = tl.full([TILE], float("-inf"), tl.float32)
    top_id = tl.full([TILE], 2147483647, tl.int32)
    in_z = tl.full([TILE], float("-inf"), tl.float32)
    for t in range(0, CAP, TILE):
        if t < n_cand:
            s, _, ids, ok = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, TILE)
            ok = ok & (s > float("-inf")) & (s >= low_score) & (s >= a)
            z = tl.where(ok, s + rng.gumbel(key, ids), float("-inf"))
            up = s >= b
            better = up & ((z > top_z) | ((z == top_z) & (ids < top_id)))
            top_id = tl.where(better, ids, top_id)
            top_z = tl.where(better, z, top_z)
            in_z = tl.maximum(in_z, tl.where(up, float("-inf"), z))
    best_z, best_id = max_lowest(top_z, top_id)
    return best_z, best_id, tl.max(in_z, axis=0)


@triton.jit
def mass_pivots(lo, spread, n_cand):
    """The nucleus searches' PIVOTS pivots over [lo, lo + spread], the first at lo, at equal
    counts of a pool whose count falls exponentially from n_cand at lo to 1 at the top (a logit
    tail's shape): the interval that holds the threshold then holds ~n_cand / PIVOTS entries.
    Evenly spread pivots put several times that in the densest intervals, next to the floor,
    where a wide nucleus ends (BENCHMARKS.md). They never decrease."""
    n_eff = tl.maximum(n_cand, 2).to(tl.float32)
    frac = (tl.arange(0, PIVOTS).to(tl.float32) / PIVOTS) * (1.0 - 1.0 / n_eff)
    return lo + spread * (tl.log(1.0 - frac) / -tl.log(n_eff))  # [PIVOTS]


@triton.jit
def _mass_tile(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, max_score, low_score,
               TILE: tl.constexpr):
    """(scores, weights exp(s - max_score)) of a pool tile; weight 0 where not counted."""
    s, _, _, ok = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, TILE)
    ok = ok & (s > float("-inf")) & (s >= low_score)
    return s, tl.where(ok, tl.exp(s - max_score), 0.0)


@triton.jit
def _copy_interval(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score, low_score, a, b,
                   scratch_ptr, room, CAP: tl.constexpr, TILE: tl.constexpr):
    """Copy the counted scores in [a, b) to `scratch_ptr` (the first `room` of them); returns
    how many there are."""
    filled = tl.full((), 0, tl.int32)
    for t in range(0, CAP, TILE):
        if t < n_cand:
            s, w = _mass_tile(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, max_score,
                              low_score, TILE)
            take = (w > 0.0) & (s >= a) & (s < b)
            pos = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(scratch_ptr + pos, s.to(tl.int32, bitcast=True), mask=take & (pos < room))
            filled += tl.sum(take.to(tl.int32), axis=0)
    return filled


@triton.jit
def _sorted_mass_threshold(scratch_ptr, n, carry, max_score, target, N: tl.constexpr):
    """The largest of `n` (<= N) scores at which `carry` plus the mass of the scores at or
    above it reaches `target`; the smallest score when none does (the pivots' pass found the
    interval's whole mass enough: only rounding disagrees)."""
    i = tl.arange(0, N)
    s = tl.load(scratch_ptr + i, mask=i < n, other=0).to(tl.float32, bitcast=True)
    return mass_threshold(s, i < n, carry, max_score, target)


@triton.jit
def mass_threshold(s, live, carry, max_score, target):
    """`_sorted_mass_threshold` of the finite scores `s` where `live` [N]."""
    desc = tl.sort(tl.where(live, order_key(s), 0), descending=True)  # [N], empty (0) last
    live = desc != 0
    s_desc = tl.where(live, key_to_float(desc), float("-inf"))
    reach = live & (carry + tl.cumsum(tl.where(live, tl.exp(s_desc - max_score), 0.0),
                                      axis=0) >= target)
    thr = tl.max(tl.where(reach, s_desc, float("-inf")), axis=0)
    return tl.where(thr > float("-inf"), thr, tl.min(tl.where(live, s_desc, float("inf")),
                                                        axis=0))


@triton.jit
def select_above(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, lo, hi, num, dest_x_ptr, dest_id_ptr,
                 BY_SCORE: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, N: tl.constexpr):
    """Copy the pool's top entries to `dest` (another pool's logits and ids): those whose value
    (BY_SCORE: the scores of allowed entries; else the raw logits of all) reaches the largest of
    SELECT_PIVOTS values spread evenly over [lo, hi] that at least `num` values reach. Returns
    how many entries that is; when it is 0 (fewer than `num` values reach `lo`, or [lo, hi] is
    not a finite interval) or more than N, nothing is copied.

    Every entry at or above the `num`-th largest value is copied, so a top-`num` answer
    computed from the copy is the pool's; one counting pass and one copying pass let that answer
    come from a sort of N entries instead of the whole pool."""
    at = tl.arange(0, SELECT_PIVOTS)
    spread = hi - lo
    n_sel = tl.full((), 0, tl.int32)
    if (lo > float("-inf")) & (spread >= 0.0) & (spread < float("inf")):
        pivots = lo + spread * (at.to(tl.float32) / SELECT_PIVOTS)  # [SELECT_PIVOTS]
        counts = tl.zeros([SELECT_PIVOTS], tl.int32)
        for t in range(0, CAP, TILE):
            if t < n_cand:
                v = _select_values(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, BY_SCORE,
                                   TILE)[0]
                counts += tl.sum((v[None, :] >= pivots[:, None]).to(tl.int32), axis=1)
        # Counts fall as the pivots rise: the pivots `num` values reach are a prefix.
        j = tl.sum((counts >= num).to(tl.int32), axis=0) - 1
        cut = tl.max(tl.where(at == j, pivots, float("-inf")), axis=0)
        n_sel = tl.sum(tl.where(at == j, counts, 0), axis=0)  # 0 when j < 0
        if (n_sel > 0) & (n_sel <= N):
            tl.debug_barrier()  # `dest` may be scratch another step of this program still reads
            filled = tl.full((), 0, tl.int32)
            for t in range(0, CAP, TILE):
                if t < n_cand:
                    v, x, ids = _select_values(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp,
                                               BY_SCORE, TILE)
                    take = v >= cut
                    pos = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
                    tl.store(dest_x_ptr + pos, x, mask=take)
                    tl.store(dest_id_ptr + pos, ids, mask=take)
                    filled += tl.sum(take.to(tl.int32), axis=0)
            tl.debug_barrier()  # the copies came from other threads of this program
    return n_sel


@triton.jit
def top_entries(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, lo, hi, num, BY_SCORE: tl.constexpr,
                CAP: tl.constexpr, TILE: tl.constexpr):
    """The pool's entries a top-`num` answer needs -> (logits, ids, count): a copy of its top
    entries behind it (`select_above`) when the pool is larger than a short sort, has room
    behind it and the copy fits one; else the pool itself."""
    if (n_cand > SHORT_POOL) & (n_cand <= CAP - SHORT_POOL):
        n_top = select_above(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, lo, hi, num,
                             pool_x_ptr + n_cand, pool_id_ptr + n_cand, BY_SCORE, CAP, TILE,
                             SHORT_POOL)
        if (n_top > 0) & (n_top <= SHORT_POOL):
            pool_x_ptr, pool_id_ptr, n_cand = pool_x_ptr + n_cand, pool_id_ptr + n_cand, n_top
    return pool_x_ptr, pool_id_ptr, n_cand


@triton.jit
def _select_values(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, BY_SCORE: tl.constexpr,
                   TILE: tl.constexpr):
    """A pool tile's values for `select_above` (-inf where not counted), with its entries as
    stored (logit bits, id word) [TILE]. Scores round as in `load_pool`."""
    i = t + tl.arange(0, TILE)
    live = i < n_cand
    x = tl.load(pool_x_ptr + i, mask=live, other=0xFF800000, cache_modifier=".cg")
    ids = tl.load(pool_id_ptr + i, mask=live, other=DISALLOWED, cache_modifier=".cg")
    raw = x.to(tl.float32, bitcast=True)
    if BY_SCORE:
        v = tl.where(ids >= 0, raw * inv_temp, float("-inf"))
    else:
        v = raw
    return v, x, ids


@triton.jit
def mass_above(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, max_score, low_score,
               CAP: tl.constexpr, TILE: tl.constexpr):
    """Sum of exp(s - max_score) over captured allowed scores >= low_score."""
    acc = tl.zeros([TILE], tl.float32)
    for t in range(0, CAP, TILE):
        if t < n_cand:
            acc += _mass_tile(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, max_score,
                              low_score, TILE)[1]
    return tl.sum(acc, axis=0)


@triton.jit
def draw_pool(pool_x_ptr, pool_id_ptr, n_cand, inv_temp, low_score, key, CAP: tl.constexpr,
              TILE: tl.constexpr):
    """Gumbel-max over captured allowed finite scores >= low_score: (best s + g, its lowest id);
    (-inf, 0) when there is none."""
    # Per-lane winners, reduced once at the end (pool order is arbitrary: ties go by id).
    best_z = tl.full([TILE], float("-inf"), tl.float32)
    best_id = tl.full([TILE], 2147483647, tl.int32)
    for t in range(0, CAP, TILE):
        if t < n_cand:
            s, _, ids, ok = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, inv_temp, TILE)
            ok = ok & (s > float("-inf")) & (s >= low_score)
            z = tl.where(ok, s + rng.gumbel(key, ids), float("-inf"))
            better = ok & ((z > best_z) | ((z == best_z) & (ids < best_id)))
            best_id = tl.where(better, ids, best_id)
            best_z = tl.where(better, z, best_z)
    top_z, top_id = max_lowest(best_z, best_id)
    return top_z, tl.where(top_z > float("-inf"), top_id, 0)


@triton.jit
def count_raw_above(pool_x_ptr, pool_id_ptr, n_cand, value, CAP: tl.constexpr, TILE: tl.constexpr):
    """Captured tokens whose raw logit is strictly above `value`."""
    acc = tl.zeros([TILE], tl.int32)
    for t in range(0, CAP, TILE):
        if t < n_cand:
            _, x, _, _ = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, 1.0, TILE)
            acc += (x > value).to(tl.int32)
    return tl.sum(acc, axis=0)


@triton.jit
def _rank_keys(pool_x_ptr, pool_id_ptr, t, n_cand, TILE: tl.constexpr):
    """64-bit keys of a pool tile ordering by raw logit, then lower id; 0 for dead entries."""
    _, x, ids, _ = load_pool(pool_x_ptr, pool_id_ptr, t, n_cand, 1.0, TILE)
    live = (t + tl.arange(0, TILE)) < n_cand
    inverted = ids.to(tl.uint32) ^ 0xFFFFFFFF
    return tl.where(live, (order_key(x).to(tl.uint64) << 32) | inverted.to(tl.uint64), 0), live


@triton.jit
def sorted_thresholds(pool_x_ptr, pool_id_ptr, n_cand, whole, all_in, below, norm, inv_temp,
                      max_s, top_k, top_p, VOCAB: tl.constexpr, TILE: tl.constexpr):
    """(top-k and top-p threshold, top-k settled, both settled) of a pool that fits one tile,
    from one sort of its scores: the k-th largest score is an entry of the sorted list, the
    top-p threshold the first entry whose running mass reaches top_p * norm (with its ties)."""
    s, _, _, ok = load_pool(pool_x_ptr, pool_id_ptr, 0, n_cand, inv_temp, TILE)
    ok = ok & (s > float("-inf"))
    n_ok = tl.sum(ok.to(tl.int32), axis=0)
    # Allowed finite scores first, descending; the rest (key 0) after them.
    s_desc = key_to_float(tl.sort(tl.where(ok, order_key(s), 0), descending=True))  # [TILE]
    at = tl.arange(0, TILE)
    use_top_k = (top_k > 0) & (top_k < VOCAB)
    thr = tl.full((), float("-inf"), tl.float32)
    k_ok = n_cand >= 0  # top-k settled (trivially when off)
    if use_top_k:
        enough = n_ok >= top_k
        t_k = tl.max(tl.where(at == top_k - 1, s_desc, float("-inf")), axis=0)
        # With fewer than k finite tokens top-k keeps them all.
        k_ok = whole & tl.where(enough, t_k > below, all_in)
        thr = tl.where(enough, t_k, float("-inf"))
    ok = k_ok
    if (top_p < 1.0) & k_ok:
        kept = (at < n_ok) & (s_desc >= thr)
        w = tl.where(kept, tl.exp(s_desc - max_s), 0.0)
        if use_top_k:
            norm = tl.sum(w, axis=0)
        # The running mass only grows: the entries that reach the target are a suffix, and
        # the threshold is its largest score (-inf when none does).
        reach = kept & (tl.cumsum(w, axis=0) >= top_p * norm)
        t_p = tl.max(tl.where(reach, s_desc, float("-inf")), axis=0)
        ok = t_p > below
        thr = tl.maximum(thr, t_p)
    return thr, k_ok, ok


@triton.jit
def top_raw(pool_x_ptr, pool_id_ptr, n_cand, num, scratch_ptr, CAP: tl.constexpr,
            TILE: tl.constexpr, K_P: tl.constexpr):
    """Top-`num` (<= K_P) captured tokens by raw logit, ties by lower id: sorted 64-bit keys
    (value key, inverted id), 0 = empty. The keys are unique. A pool that fits one tile is
    sorted whole (through `scratch_ptr`, K_P int64); a larger one keeps a running top-K_P
    over its tiles."""
    at = tl.arange(0, K_P)
    if (K_P <= TINY_POOL) & (TINY_POOL < TILE) & (n_cand <= TINY_POOL):
        _sort_top(pool_x_ptr, pool_id_ptr, n_cand, num, scratch_ptr, K_P, TINY_POOL)
        tl.debug_barrier()
        best = tl.load(scratch_ptr + at).to(tl.uint64, bitcast=True)
    elif (SHORT_POOL < TILE) & (n_cand <= SHORT_POOL):
        _sort_top(pool_x_ptr, pool_id_ptr, n_cand, num, scratch_ptr, K_P, SHORT_POOL)
        tl.debug_barrier()
        best = tl.load(scratch_ptr + at).to(tl.uint64, bitcast=True)
    elif n_cand <= TILE:
        _sort_top(pool_x_ptr, pool_id_ptr, n_cand, num, scratch_ptr, K_P, TILE)
        tl.debug_barrier()  # the stores came from other threads of this program
        best = tl.load(scratch_ptr + at).to(tl.uint64, bitcast=True)
    else:
        # A running top-K_P over the pool's tiles: one partial sort of each tile, where a radix
        # search of the 64-bit keys took 16 passes over every tile.
        best = tl.zeros([K_P], tl.uint64)
        floor = tl.full((), 0, tl.uint64)
        for t in range(0, CAP, TILE):
            if t < n_cand:
                best, floor = merge_top(best, floor, _rank_keys(pool_x_ptr, pool_id_ptr, t,
                                                               n_cand, TILE)[0], K_P)
        best = tl.where(at < num, best, 0)
    return best


@triton.jit
def _sort_top(pool_x_ptr, pool_id_ptr, n_cand, num, scratch_ptr, K_P: tl.constexpr,
              N: tl.constexpr):
    """Sort the rank keys of a pool of at most N (>= K_P) entries and store the first `num`
    into `scratch_ptr` [K_P], the rest of it 0."""
    keys, live = _rank_keys(pool_x_ptr, pool_id_ptr, 0, n_cand, N)
    desc = tl.sort(keys, descending=True)  # [N], dead entries (0) last
    pos = tl.arange(0, N)
    tl.store(scratch_ptr + pos, tl.where(pos < num, desc, 0).to(tl.int64, bitcast=True),
             mask=pos < K_P)


@triton.jit
def unpack_top(best, lse):
    """Sorted keys of `top_raw` -> (ids, logprobs, raw logits); empty entries -1, -inf, -inf."""
    empty = best == 0
    ids = ((best & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32, bitcast=True)
    x = key_to_float((best >> 32).to(tl.uint32))
    return tl.where(empty, -1, ids), tl.where(empty, float("-inf"), x - lse), \
        tl.where(empty, float("-inf"), x)
