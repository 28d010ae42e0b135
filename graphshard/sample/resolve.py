"""Triton device functions that settle one row from its chunks' results and its candidate pool
(`candidates`), falling back to whole-row passes (`rows`) only when the pool
cannot prove its answer. Called by the sampler's per-request kernel.

Partials are read with `.cg` loads: they were written by the previous launch from other SMs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample.deep import draw_deep_nucleus, no_interval
from graphshard.sample.rows import (draw_filtered, key_to_float, load_four, load_masked,
                                    logprob_row, max_lowest, order_key, scan_span, top_p_only)
from graphshard.sample.candidates import (SHORT_POOL, TINY_POOL, count_raw_above, draw_pool,
                                          floor_score, mass_above, search_mass, search_pool,
                                          sorted_thresholds, top_entries, top_raw, unpack_top)
from graphshard.sample.workspace import (P_ARG_X, P_ARG_Z, P_FLOOR_R, P_FLOOR_S, P_MAX_R,
                                          P_MAX_X, P_MAX_Z, P_NAN, P_SUM_R, P_SUM_S, STAT_COUNTS,
                                          STAT_DEEP, STAT_DRAWS, STAT_LOGPROBS, STAT_POOL_CHECKS,
                                          STAT_RACED, padded)


@triton.jit
def load_part(part_ptr, FIELD: tl.constexpr, SPLITS: tl.constexpr, other, AS_FLOAT: tl.constexpr):
    """One field of every chunk [padded(SPLITS)]; padding entries are `other`."""
    splits = tl.arange(0, padded(SPLITS))
    vals = tl.load(part_ptr + FIELD * SPLITS + splits, mask=splits < SPLITS, other=0,
                   cache_modifier=".cg")
    if AS_FLOAT:
        return tl.where(splits < SPLITS, vals.to(tl.float32, bitcast=True), other)
    return tl.where(splits < SPLITS, vals, other)


@triton.jit
def combine_max(part_ptr, VAL: tl.constexpr, ARG: tl.constexpr, SPLITS: tl.constexpr):
    """(max, lowest id at it) of a row from its chunks' (max, lowest id at the chunk max) pairs:
    exactly the one-pass result (a chunk without finite values reports (-inf, 0))."""
    vals = load_part(part_ptr, VAL, SPLITS, float("-inf"), True)
    ids = load_part(part_ptr, ARG, SPLITS, 2147483647, False)
    return max_lowest(vals, ids)


@triton.jit
def softmax_mass(part_ptr, MAX: tl.constexpr, SUM: tl.constexpr, row_max, scale,
                 SPLITS: tl.constexpr):
    """sum over chunks of sum exp(v - row_max), from each chunk's max m_c (times `scale`) and
    its sum exp(v - m_c * scale)."""
    maxes = load_part(part_ptr, MAX, SPLITS, float("-inf"), True) * scale
    sums = load_part(part_ptr, SUM, SPLITS, 0.0, True)
    return tl.sum(tl.where(maxes > float("-inf"), sums * tl.exp(maxes - row_max), 0.0), axis=0)


@triton.jit
def count_row(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, v_s, max_s, v_r,
              BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, TILES: tl.constexpr):
    """Whole-row counts: allowed finite scores above v_s, their sum exp(s - max_s), and raw
    logits above v_r. TILES tiles a step (1 or 4), all loaded before any is counted: one
    program's pass waits on each step's loads, so four keep four times the bytes in flight
    (a row's count at V = 152064 fp32: ~39 -> ~23 µs on an H100, BENCHMARKS.md). Each lane
    sums its tiles in column order either way, so the sums round alike."""
    lanes = tl.arange(0, BLOCK)
    acc = (tl.zeros([BLOCK], tl.int32), tl.zeros([BLOCK], tl.float32), tl.zeros([BLOCK], tl.int32))
    if TILES == 1:
        for start in range(0, VOCAB, BLOCK):
            a = load_masked(row_ptr, mask_row_ptr, mask_on, start + lanes, VOCAB, HAS_BITMASK)
            acc = _count_tile(a[0], a[2], inv_temp, v_s, max_s, v_r, acc)
    else:
        tl.static_assert(TILES == 4, "count_row takes 1 or 4 tiles a step")
        for start in range(0, VOCAB, 4 * BLOCK):
            a, b, c, d = load_four(row_ptr, mask_row_ptr, mask_on, start + lanes, BLOCK, VOCAB,
                                   HAS_BITMASK)
            acc = _count_tile(a[0], a[2], inv_temp, v_s, max_s, v_r, acc)
            acc = _count_tile(b[0], b[2], inv_temp, v_s, max_s, v_r, acc)
            acc = _count_tile(c[0], c[2], inv_temp, v_s, max_s, v_r, acc)
            acc = _count_tile(d[0], d[2], inv_temp, v_s, max_s, v_r, acc)
    cnt_s, mass_s, cnt_r = acc
    return tl.sum(cnt_s, axis=0), tl.sum(mass_s, axis=0), tl.sum(cnt_r, axis=0)


@triton.jit
def _count_tile(x, raw, inv_temp, v_s, max_s, v_r, acc):
    cnt_s, mass_s, cnt_r = acc
    s = x * inv_temp
    above = (x > float("-inf")) & (s > v_s)
    return (cnt_s + above.to(tl.int32), mass_s + tl.where(above, tl.exp(s - max_s), 0.0),
            cnt_r + (raw > v_r).to(tl.int32))


@triton.jit
def token_index(token, VOCAB: tl.constexpr):
    """A token id used as an address, kept inside the row whatever the value (every path
    yields ids in [0, VOCAB); this guards the loads should one not)."""
    return tl.minimum(tl.maximum(token, 0), VOCAB - 1)


@triton.jit
def store_logprobs(rec_ptr, r, ids, vals, token_logprob, rank, num, M: tl.constexpr,
                   K: tl.constexpr):
    """Row r's logprob fields of a record (`ids`, `vals` [padded(K)]); entries past `num` are
    empty."""
    at = tl.arange(0, padded(K))
    keep = at < num
    out = rec_ptr + M + 3 + r * K + at
    tl.store(out, tl.where(keep, ids, -1), mask=at < K)
    vals = tl.where(keep, vals, float("-inf"))
    tl.store(out + M * K, vals.to(tl.int32, bitcast=True), mask=at < K)
    tl.store(rec_ptr + M + 3 + 2 * M * K + r, token_logprob.to(tl.int32, bitcast=True))
    tl.store(rec_ptr + M + 3 + 2 * M * K + M + r, rank)


@triton.jit
def settle_token(pool, row, small_k, drawn_before, scratch, VOCAB: tl.constexpr,
                 SPLITS: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr, BLOCK: tl.constexpr,
                 SMALL_BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, RADIX_BITS: tl.constexpr,
                 NUCLEUS_WINNER: tl.constexpr, COUNT_TILES: tl.constexpr, RACE: tl.constexpr):
    """The row's token: greedy argmax, unfiltered Gumbel winner, or the filtered draw. `pool` is
    the row's (partials, pool count, pool logits, pool ids, stats); `row` (logits row, bitmask
    row, mask flag, RNG key, 1 / temperature, top_k, top_p, min_p, logprobs, random, filtered);
    `small_k`: a top-k the scan captured whole; `drawn_before`, None or (used, drawn, token,
    first): a top-p-only row's draw that its finish programs already made (`nucleus`), in place
    of `draw_from_pool`'s where used, and the deep draw's first interval when they weighed it
    (`deep_split`); `scratch`: a word the deep nucleus draw
    (`deep`) may use (the row's top-K scratch, free until its logprobs); NUCLEUS_WINNER: the
    scan drew a top-p-only row's unfiltered winner (`kernels.nucleus_winner`)."""
    part, n_pool, pool_x, pool_id, stats = pool
    (row_ptr, mask_row_ptr, mask_on, key, inv_temp, top_k, top_p, min_p, _logprobs, is_random,
     filtered) = row
    max_x, token = combine_max(part, P_MAX_X, P_ARG_X, SPLITS)
    if is_random:
        # An unfiltered row's winner, and with NUCLEUS_WINNER (small batch, `kernels`) a
        # top-p-only row's (`nucleus`), whose chunks' streams drew it too. Without a finite
        # score every chunk reports (-inf, 0): the winner is token 0.
        winner = combine_max(part, P_MAX_Z, P_ARG_Z, SPLITS)[1]
        token = winner
        nucleus = top_p_only(top_k, top_p, min_p, VOCAB)
        max_s = max_x * inv_temp
        if SPLITS == 1:
            # A one-chunk vocabulary is one program's work whatever the path: no pool.
            if filtered & (max_x > float("-inf")):
                token = draw_filtered(row_ptr, mask_row_ptr, mask_on, VOCAB, key, inv_temp, max_x,
                                      top_k, top_p, min_p, BLOCK, SMALL_BLOCK, HAS_BITMASK,
                                      RADIX_BITS)
        elif filtered & (max_x > float("-inf")):
            floor_x = tl.max(load_part(part, P_FLOOR_S, SPLITS, float("-inf"), True),
                             axis=0)
            norm = softmax_mass(part, P_MAX_X, P_SUM_S, max_s, inv_temp, SPLITS)
            raced = n_pool < -1
            if drawn_before is None:
                first = no_interval()
                drawn, token, t_m, k_ok, raced = draw_from_pool(
                    pool_x, pool_id, n_pool, floor_x, norm, key, inv_temp, max_s, top_k, top_p,
                    min_p, VOCAB, CAP, TILE, RADIX_BITS, RACE)
            else:
                used, drawn, token, first = drawn_before
                # Without top-k and min-p (the split draw's rows) these are max_s and true.
                t_m = max_s
                k_ok = n_pool >= 0
                if ~used:
                    drawn, token, t_m, k_ok, raced = draw_from_pool(
                        pool_x, pool_id, n_pool, floor_x, norm, key, inv_temp, max_s, top_k,
                        top_p, min_p, VOCAB, CAP, TILE, RADIX_BITS, RACE)
            if RACE:
                if raced:
                    tl.atomic_add(stats + STAT_RACED, 1, sem="relaxed")
            whole_row = ~drawn
            # A deep draw's first interval weighed by the row's programs answers the winner's
            # check too (`deep_split`): the winner is kept exactly when it beats the interval.
            if whole_row & ~small_k & ~first[0]:
                # The unfiltered winner is the answer exactly when it survives the filters:
                # fewer than k tokens and less than top_p of the mass lie above it (the norm
                # must not hang on an unsettled top-k), and min-p keeps it. The chunks' streams
                # drew it for a top-p-only row under NUCLEUS_WINNER; other filtered rows skip
                # the RNG there, and one pass finds it here.
                w0 = winner
                own_pass = filtered
                if NUCLEUS_WINNER:
                    own_pass = ~nucleus
                if own_pass:
                    w0 = scan_span(row_ptr, mask_row_ptr, mask_on, 0, inv_temp, key, True, False,
                                   False, VOCAB, VOCAB, SMALL_BLOCK, HAS_BITMASK)[4]
                token = w0
                v_s = tl.load(row_ptr + token_index(w0, VOCAB)).to(tl.float32) * inv_temp
                if ((min_p <= 0.0) | (v_s >= t_m)) & (k_ok | (top_p >= 1.0)):
                    if nucleus & (n_pool <= CAP) & (v_s > floor_score(floor_x, inv_temp)) \
                            & (v_s < float("inf")):
                        # Every score above the winner's was captured, so the pool holds the
                        # mass above it: one pass over the pool, not over the row.
                        mass = mass_above(pool_x, pool_id, tl.maximum(n_pool, 0), inv_temp, max_s,
                                          key_to_float(order_key(v_s) + 1), CAP, TILE)
                        tl.atomic_add(stats + STAT_POOL_CHECKS, 1, sem="relaxed")
                        whole_row = ~(mass < top_p * norm)
                    else:
                        above, mass, _r = count_row(row_ptr, mask_row_ptr, mask_on, VOCAB,
                                                    inv_temp, v_s, max_s, float("inf"), BLOCK,
                                                    HAS_BITMASK, COUNT_TILES)
                        tl.atomic_add(stats + STAT_COUNTS, 1, sem="relaxed")
                        use_top_k = (top_k > 0) & (top_k < VOCAB)
                        whole_row = ~((~use_top_k | (above < top_k))
                                      & ((top_p >= 1.0) | (mass < top_p * norm)))
            if whole_row & nucleus & (max_s < float("inf")):
                # A nucleus deeper than the pool whose unfiltered winner it leaves out (one
                # draw in ten at top-p 0.9; the check above costs a third of this): passes
                # weighing the row find the threshold's interval, whose tokens are copied behind
                # the pool and sorted.
                deep, deep_token = draw_deep_nucleus(
                    row_ptr, mask_row_ptr, mask_on, pool_x, pool_id, n_pool,
                    scratch.to(tl.pointer_type(tl.int32)), VOCAB, key, inv_temp, max_s,
                    floor_score(floor_x, inv_temp), top_p * norm, first, CAP, SMALL_BLOCK,
                    HAS_BITMASK)
                if deep:
                    token = deep_token
                    tl.atomic_add(stats + STAT_DEEP, 1, sem="relaxed")
                whole_row = ~deep
            if whole_row:
                token = draw_filtered(row_ptr, mask_row_ptr, mask_on, VOCAB, key, inv_temp, max_x,
                                      top_k, top_p, min_p, BLOCK, SMALL_BLOCK, HAS_BITMASK,
                                      RADIX_BITS)
                tl.atomic_add(stats + STAT_DRAWS, 1, sem="relaxed")
    return token


@triton.jit
def draw_from_pool(pool_x, pool_id, n_pool, floor_x, norm, key, inv_temp, max_s, top_k,
                   top_p, min_p, VOCAB: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
                   RADIX_BITS: tl.constexpr, RACE: tl.constexpr):
    """Filtered Gumbel-max draw from the pool when every kept token is in it -> (drawn, token
    (0 when not drawn), min-p threshold, top-k settled, drawn by `search_mass`'s race). `floor_x` is the largest chunk floor, `norm` the row's
    total mass exp(s - max_s) (the top-p norm without top-k). A pool that fits two tiles is
    sorted once; a larger one is searched (`searched_thresholds`). A top-k row settles from its
    pool's top entries alone (`candidates.top_entries`, copied behind the pool): every token
    it keeps is among them."""
    n_cand = tl.maximum(tl.minimum(n_pool, CAP), 0)
    whole = n_pool <= CAP  # every capture reached the pool
    below = floor_score(floor_x, inv_temp)  # the best score an uncaptured token can have
    all_in = whole & (floor_x == float("-inf"))  # every finite allowed token was captured
    if whole & (top_k > 0) & (top_k <= SHORT_POOL) & (top_k < VOCAB):
        # Top-p and min-p keep a subset of top-k's set, and the draw picks from it.
        pool_x, pool_id, n_cand = top_entries(pool_x, pool_id, n_cand, inv_temp, below, max_s,
                                              top_k, True, CAP, TILE)
    raced = n_cand < 0
    raced_token = tl.zeros((), tl.int32)
    if (TINY_POOL < TILE) & (n_cand <= TINY_POOL):
        thr, k_ok, ok = sorted_thresholds(pool_x, pool_id, n_cand, whole, all_in, below, norm,
                                          inv_temp, max_s, top_k, top_p, VOCAB, TINY_POOL)
    elif (SHORT_POOL < TILE) & (n_cand <= SHORT_POOL):
        thr, k_ok, ok = sorted_thresholds(pool_x, pool_id, n_cand, whole, all_in, below, norm,
                                          inv_temp, max_s, top_k, top_p, VOCAB, SHORT_POOL)
    elif n_cand <= TILE:
        thr, k_ok, ok = sorted_thresholds(pool_x, pool_id, n_cand, whole, all_in, below, norm,
                                          inv_temp, max_s, top_k, top_p, VOCAB, TILE)
    elif (CAP > TILE) & (n_cand <= 2 * TILE):
        # A pool just past one tile (a shared cut refined in one pass can leave a few more than
        # 1024 entries): one sort of two tiles, where the searches take 8 or more passes.
        thr, k_ok, ok = sorted_thresholds(pool_x, pool_id, n_cand, whole, all_in, below, norm,
                                          inv_temp, max_s, top_k, top_p, VOCAB, 2 * TILE)
    else:
        # Without min-p the draw is over the top-p threshold's scores alone: the search may
        # race it.
        thr, k_ok, ok, raced, raced_token = searched_thresholds(
            pool_x, pool_id, n_cand, whole, all_in, below, norm, inv_temp, max_s, top_k, top_p,
            key, min_p <= 0.0, VOCAB, CAP, TILE, RADIX_BITS, RACE)
    t_m = max_s + tl.log(tl.where(min_p > 0.0, min_p, 1.0))
    thr = tl.where(min_p > 0.0, tl.maximum(thr, t_m), thr)
    ok = ok & whole & ((thr > below) | all_in)
    token = tl.full((), 0, tl.int32)
    if ok:
        if raced:
            token = raced_token
        elif (SHORT_POOL < TILE) & (n_cand <= SHORT_POOL):
            token = draw_pool(pool_x, pool_id, n_cand, inv_temp, thr, key, SHORT_POOL,
                              SHORT_POOL)[1]
        else:
            token = draw_pool(pool_x, pool_id, n_cand, inv_temp, thr, key, CAP, TILE)[1]
    return ok, token, t_m, k_ok, ok & raced


@triton.jit
def searched_thresholds(pool_x, pool_id, n_cand, whole, all_in, below, norm, inv_temp, max_s,
                        top_k, top_p, key, race, VOCAB: tl.constexpr, CAP: tl.constexpr,
                        TILE: tl.constexpr, RADIX_BITS: tl.constexpr, RACE: tl.constexpr):
    """(top-k and top-p threshold, top-k settled, both settled, raced, token) by searches over
    the pool; with `race`, the top-p search may draw the token too (`search_mass`: `raced`)."""
    use_top_k = (top_k > 0) & (top_k < VOCAB)
    use_top_p = top_p < 1.0
    thr = tl.full((), float("-inf"), tl.float32)
    k_ok = n_cand >= 0  # top-k settled (trivially when off)
    if use_top_k:
        t_k, found = search_pool(pool_x, pool_id, n_cand, inv_temp, max_s, float("-inf"),
                                 top_k.to(tl.float32), False, CAP, TILE, RADIX_BITS)
        enough = found >= top_k.to(tl.float32)
        # With fewer than k finite tokens top-k keeps them all.
        k_ok = whole & tl.where(enough, t_k > below, all_in)
        thr = tl.where(enough, t_k, float("-inf"))
        if use_top_p:
            norm = mass_above(pool_x, pool_id, n_cand, inv_temp, max_s, thr, CAP, TILE)
    ok = k_ok
    raced = n_cand < 0
    token = tl.zeros((), tl.int32)
    if use_top_p & k_ok:
        t_p, raced, token = search_mass(pool_x, pool_id, n_cand, inv_temp, max_s, thr, below,
                                        top_p * norm, key, race, CAP, TILE, RADIX_BITS,
                                        RACE)
        ok = t_p > below
        thr = tl.maximum(thr, t_p)
    return thr, k_ok, ok, raced, token


@triton.jit
def settle_logprobs(pool, top, rec_ptr, row_ptr, r, token, at_max, num, VOCAB: tl.constexpr,
                    M: tl.constexpr, K: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr,
                    TILE: tl.constexpr, BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr,
                    COUNT_TILES: tl.constexpr):
    """Row r's logprob fields: the top-K list and the token's logprob from the pool when it
    holds every token they need, its rank when the token lies above every floor; whole-row
    passes for what the pool cannot prove. `at_max`: the token is the row's largest raw logit
    (a greedy row without a bitmask), so its logit is the chunks' maximum and its rank 1."""
    if SPLITS == 1:
        ids, vals, token_logprob, rank = logprob_row(row_ptr, VOCAB, token, SMALL_BLOCK,
                                                     padded(K))
        store_logprobs(rec_ptr, r, ids, vals, token_logprob, rank, num, M, K)
    else:
        _settle_logprobs_from_pool(pool, top, rec_ptr, row_ptr, r, token, at_max, num, VOCAB,
                                   M, K, SPLITS, CAP, TILE, BLOCK, SMALL_BLOCK, COUNT_TILES)


@triton.jit
def _settle_logprobs_from_pool(pool, top, rec_ptr, row_ptr, r, token, at_max, num,
                               VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr,
                               SPLITS: tl.constexpr, CAP: tl.constexpr, TILE: tl.constexpr,
                               BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr,
                               COUNT_TILES: tl.constexpr):
    K_P: tl.constexpr = padded(K)
    part, n_pool, pool_x, pool_id, stats = pool
    n_cand = tl.maximum(tl.minimum(n_pool, CAP), 0)
    whole = n_pool <= CAP
    max_r = tl.max(load_part(part, P_MAX_R, SPLITS, float("-inf"), True), axis=0)
    total = softmax_mass(part, P_MAX_R, P_SUM_R, max_r, 1.0, SPLITS)
    lse = tl.where(max_r == float("-inf"), 0.0, max_r + tl.log(total))
    floor_r = tl.max(load_part(part, P_FLOOR_R, SPLITS, float("-inf"), True), axis=0)
    # The list comes from the pool's top entries alone when they fit a short sort, copied
    # behind the pool (`candidates.top_entries`); the list is checked against floor_r as is.
    top_x, top_id, n_top = pool_x, pool_id, n_cand
    if whole:
        top_x, top_id, n_top = top_entries(pool_x, pool_id, n_cand, 1.0, floor_r, max_r, num,
                                           False, CAP, TILE)
    ids, vals, xs = unpack_top(top_raw(top_x, top_id, n_top, num, top, CAP, TILE, K_P), lse)
    at = tl.arange(0, K_P)
    last_x = tl.max(tl.where(at == num - 1, xs, float("-inf")), axis=0)
    # The list is exact when its last needed entry is finite and at or above every floor.
    list_ok = whole & (last_x > float("-inf")) & (last_x >= floor_r)
    if at_max:
        # No load of the token's logit: at large batch the row left L2 long ago, and the
        # round trip to memory came after the pool's sorts.
        tok_x = max_r
    else:
        tok_x = tl.load(row_ptr + token_index(token, VOCAB)).to(tl.float32)
        tok_x = tl.where(tok_x != tok_x, float("-inf"), tok_x)
    if list_ok:
        if at_max:
            rank = 1  # no raw logit lies above the row's maximum
        elif whole & (tok_x >= floor_r):
            rank = 1 + count_raw_above(pool_x, pool_id, n_cand, tok_x, CAP, TILE)
        else:
            rank = 1 + count_row(row_ptr, row_ptr, False, VOCAB, 1.0, float("inf"), 0.0, tok_x,
                                 BLOCK, False, COUNT_TILES)[2]
            tl.atomic_add(stats + STAT_COUNTS, 1, sem="relaxed")
        store_logprobs(rec_ptr, r, ids, vals, tok_x - lse, rank, num, M, K)
    else:
        ids, vals, token_logprob, rank = logprob_row(row_ptr, VOCAB, token, SMALL_BLOCK, K_P)
        store_logprobs(rec_ptr, r, ids, vals, token_logprob, rank, num, M, K)
        tl.atomic_add(stats + STAT_LOGPROBS, 1, sem="relaxed")


@triton.jit
def has_nan(part, SPLITS: tl.constexpr):
    """1 if any chunk of the row holds a NaN."""
    return tl.max(load_part(part, P_NAN, SPLITS, 0, False), axis=0)
