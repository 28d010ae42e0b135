"""Triton device functions of the deep nucleus draw's first round split over a row's finish
programs (small batches): a top-p row whose nucleus reaches below its pool, and whose unfiltered
Gumbel winner (the scan draws it at small batch) lies at or below the pool's floor.

Such a row, settled by one program, passes over the whole row several times: a count that checks
the winner against the nucleus, then the deep draw's weighing and copying passes (`deep`): ~390
µs at V = 152064 fp32 on an H100, against ~30 for a row its pool settles. The row's finish
programs cannot wait for one another between passes. Each finds alone, from what the scan
left, that the winner's score is at or below the pool's floor (`winner_below`), so the pool
cannot check it; whether the pool's mass (every score above the floor is in it) falls short of
top_p * norm, so that the threshold lies below the pool, the first of them to weigh the pool
publishes for all (`nucleus.agree_wide`): the split draw's programs reorder the pool in place
once they know, so a later program's sum over it need not match. The row then needs its row:
1. `weigh_span`, in each of the row's PROGRAMS programs: a 1/PROGRAMS span of the row weighed
   at the deep draw's first pivots (`deep.first_offsets`, the same in every program): per
   interval between two pivots, its mass, count and Gumbel-max winner, stored to the row's
   scratch in `nucleus.weigh_slice`'s layout.
2. `first_interval`, in the last program to arrive: the summed masses say which interval holds
   the threshold. When the best Gumbel score above that interval beats every one in it, its
   token is the answer, whatever the threshold; otherwise the interval goes to the deep draw as
   its first round (`deep.draw_deep_nucleus`), which copies its tokens (one pass, no RNG) and
   sorts them, or weighs it again when it does not fit a sort.
The answer is the deep draw's. The winner's check needs no pass of its own: a kept winner is
the best score above the interval, or in it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample import rng
from graphshard.sample.candidates import PIVOTS, STAT_WORDS
from graphshard.sample.deep import first_offsets
from graphshard.sample.resolve import combine_max, token_index
from graphshard.sample.rows import load_four
from graphshard.sample.workspace import P_ARG_Z, P_MAX_Z

_NO_ID = tl.constexpr(2147483647)
# Lanes of `weigh_span`'s per-lane sums ([PIVOTS, SPAN_LANES] of mass, count, best Gumbel score
# and its id): four sums, where `deep.weigh_row` keeps two over WEIGH_LANES. Unheld, ptxas gave
# the small-batch finish 191 registers with 128 lanes and 196 with 64 (CPU compile, sm_90a): the
# sums do not set its register count, SPLIT_FINISH_REGISTERS in `grid` holds it. Timed with 64.
SPAN_LANES = tl.constexpr(64)


@triton.constexpr_function
def span_size(vocab, programs, lanes):
    """Columns each of a row's programs weighs: whole steps of four tiles of `lanes`."""
    step = 4 * lanes
    return -(-vocab // (programs * step)) * step


@triton.jit
def winner_below(row_ptr, part, inv_temp, lo, VOCAB: tl.constexpr, SPLITS: tl.constexpr):
    """Whether the scan's unfiltered winner of a top-p row scores at or below `lo`, the best
    score an uncaptured token can have: the pool cannot check it. The same answer in every
    program of the row: it reads only what the scan left."""
    winner = combine_max(part, P_MAX_Z, P_ARG_Z, SPLITS)[1]
    v_s = tl.load(row_ptr + token_index(winner, VOCAB)).to(tl.float32)
    return v_s * inv_temp <= lo


@triton.jit
def first_pivots(pool_x, pool_id, n_pool, inv_temp, start, CAP: tl.constexpr,
                 TILE: tl.constexpr):
    """The deep draw's first round's pivots [PIVOTS], falling from `start`, the last at -inf."""
    at = tl.arange(0, PIVOTS)
    offsets = first_offsets(pool_x, pool_id, n_pool, inv_temp, start, CAP, TILE)
    return tl.where(at < PIVOTS - 1, start - offsets, float("-inf"))


@triton.jit
def _uppers(pivots):
    """Each interval's upper end [PIVOTS]: the pivot before it, +inf for the first."""
    at = tl.arange(0, PIVOTS)
    before = tl.sum(tl.where(at[None, :] == at[:, None] - 1, pivots[None, :], 0.0), axis=1)
    return tl.where(at == 0, float("inf"), before)


@triton.jit
def weigh_span(row_ptr, mask_row_ptr, mask_on, q, VOCAB: tl.constexpr, key, inv_temp, max_s,
               pivots, stats_ptr, PROGRAMS: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """Program `q`'s part: the row's columns [q * SPAN, (q + 1) * SPAN) weighed at `pivots`.
    Interval k holds the allowed finite scores in [pivots[k], pivots[k - 1]). Per-lane sums,
    reduced once, four tiles a step (as `deep.weigh_row`)."""
    LANES: tl.constexpr = SPAN_LANES
    SPAN: tl.constexpr = span_size(VOCAB, PROGRAMS, LANES)
    at = tl.arange(0, PIVOTS)
    lanes = tl.arange(0, LANES)
    uppers = _uppers(pivots)
    acc = (tl.zeros([PIVOTS, LANES], tl.float32), tl.zeros([PIVOTS, LANES], tl.int32),
           tl.full([PIVOTS, LANES], float("-inf"), tl.float32),
           tl.full([PIVOTS, LANES], _NO_ID, tl.int32))
    for t in range(0, SPAN, 4 * LANES):
        offs = q * SPAN + t + lanes
        a, b, c, d = load_four(row_ptr, mask_row_ptr, mask_on, offs, LANES, VOCAB, HAS_BITMASK)
        # Lanes see their ids in rising order: a tie keeps the lane's earlier winner.
        acc = _weigh_tile(a[0], offs, key, inv_temp, max_s, pivots, uppers, acc)
        acc = _weigh_tile(b[0], offs + LANES, key, inv_temp, max_s, pivots, uppers, acc)
        acc = _weigh_tile(c[0], offs + 2 * LANES, key, inv_temp, max_s, pivots, uppers, acc)
        acc = _weigh_tile(d[0], offs + 3 * LANES, key, inv_temp, max_s, pivots, uppers, acc)
    mass, count, best_z, best_id = acc
    top_z = tl.max(best_z, axis=1)
    top_id = tl.min(tl.where(best_z == top_z[:, None], best_id, _NO_ID), axis=1)
    base = stats_ptr + q * STAT_WORDS
    tl.store(base + at, tl.sum(mass, axis=1).to(tl.int32, bitcast=True))
    tl.store(base + PIVOTS + at, tl.sum(count, axis=1))
    tl.store(base + 2 * PIVOTS + at, top_z.to(tl.int32, bitcast=True))
    tl.store(base + 3 * PIVOTS + at, top_id)


@triton.jit
def _weigh_tile(x, offs, key, inv_temp, max_s, pivots, uppers, acc):
    mass, count, best_z, best_id = acc
    s = x * inv_temp
    finite = x > float("-inf")
    w = tl.where(finite, tl.exp(s - max_s), 0.0)
    z = s + rng.gumbel(key, offs)
    member = finite[None, :] & (s[None, :] >= pivots[:, None]) & (s[None, :] < uppers[:, None])
    better = member & (z[None, :] > best_z)  # [PIVOTS, LANES]
    return (mass + tl.where(member, w[None, :], 0.0), count + member.to(tl.int32),
            tl.where(better, z[None, :], best_z), tl.where(better, offs[None, :], best_id))


@triton.jit
def first_interval(stats_ptr, pivots, target, PROGRAMS: tl.constexpr):
    """The last program's part, once every program has weighed its span -> (settled, token,
    first): `settled` when the best Gumbel score above the threshold's interval beats every
    one in it (`token` is then the answer); otherwise `first`, the interval as
    `deep.draw_deep_nucleus` takes it, `known` false when the sums do not single one out
    (rounding: the deep draw then starts over)."""
    at = tl.arange(0, PIVOTS)
    progs = tl.arange(0, PROGRAMS)
    cell = stats_ptr + progs[:, None] * STAT_WORDS + at[None, :]  # [PROGRAMS, PIVOTS]
    mass = tl.sum(tl.load(cell, cache_modifier=".cg").to(tl.float32, bitcast=True), axis=0)
    count = tl.sum(tl.load(cell + PIVOTS, cache_modifier=".cg"), axis=0)
    best_z = tl.load(cell + 2 * PIVOTS, cache_modifier=".cg").to(tl.float32, bitcast=True)
    best_id = tl.load(cell + 3 * PIVOTS, cache_modifier=".cg")
    # The mass and count at or above each pivot; the threshold's interval j is the first whose
    # pivot's mass reaches target (the sums are rounded separately: take the first, not a count).
    upto = at[None, :] <= at[:, None]  # [PIVOTS, PIVOTS]: row k sums intervals 0..k
    mass_at = tl.sum(tl.where(upto, mass[None, :], 0.0), axis=1)
    count_at = tl.sum(tl.where(upto, count[None, :], 0), axis=1)
    j = tl.min(tl.where(mass_at >= target, at, PIVOTS), axis=0)
    n_in = tl.sum(tl.where(at == j, count, 0), axis=0)
    # Interval 0 reaching target would put the threshold in the pool, short of it by the
    # check that sent the row here; none reaching it: rounding.
    known = (j > 0) & (j < PIVOTS) & (n_in > 0)
    lo = tl.max(tl.where(at == j, pivots, float("-inf")), axis=0)
    hi = tl.max(tl.where(at == j - 1, pivots, float("-inf")), axis=0)
    carry = tl.sum(tl.where(at == j - 1, mass_at, 0.0), axis=0)
    above = tl.sum(tl.where(at == j - 1, count_at, 0), axis=0)
    top_z, top_id = best_cell(best_z, best_id, (at < j)[None, :])
    in_z, in_id = best_cell(best_z, best_id, (at == j)[None, :])
    # Every score in the interval that the threshold keeps has a Gumbel score of at most in_z.
    settled = known & ((top_z > in_z) | ((top_z == in_z) & (top_id < in_id)))
    return settled, top_id, (known, lo, hi, carry, above, n_in, top_z, top_id)


@triton.jit
def best_cell(best_z, best_id, cells):
    """The best of the Gumbel-max winners stored per program and interval ([programs, PIVOTS],
    as `weigh_span` and `nucleus.weigh_slice` store them) where `cells` holds -> (its score,
    its lowest id)."""
    z = tl.max(tl.max(tl.where(cells, best_z, float("-inf")), axis=1), axis=0)
    z_id = tl.min(tl.min(tl.where(cells & (best_z == z), best_id, _NO_ID), axis=1), axis=0)
    return z, z_id
