"""Triton device functions over one logits row, or one vocabulary chunk of it, for the sampler.

`graphshard.sample.kernels` holds the contract and the two kernels that call these: a split pass
(`scan_chunk` over one chunk per program) and a per-request pass (threshold searches, filtered
draws and logprobs over whole rows). Every function computes in fp32 and treats NaN as -inf
(`sum_chunk` by reading a chunk that holds one again).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from graphshard.sample import rng


@triton.jit
def order_key(x):
    """fp32 -> uint32 with the same order, so a float threshold can be searched bit by bit."""
    b = x.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def max_lowest(values, ids):
    """(max of `values` [N], the lowest of `ids` at it): ties go to the lowest id whatever order
    the reduction combines in."""
    top = tl.max(values, axis=0)
    return top, tl.min(tl.where(values == top, ids, 2147483647), axis=0)


@triton.jit
def key_to_float(k):
    b = tl.where((k >> 31) != 0, k ^ 0x80000000, k ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def uses_filters(top_k, top_p, min_p, VOCAB: tl.constexpr):
    """Whether any of top-k, top-p, min-p is on: such rows need whole-row passes."""
    use_top_k = (top_k > 0) & (top_k < VOCAB)
    return use_top_k | (top_p < 1.0) | (min_p > 0.0)


@triton.jit
def top_p_only(top_k, top_p, min_p, VOCAB: tl.constexpr):
    """Whether top-p is the row's one filter (top-k off or >= VOCAB, min-p off): the rows whose
    pool the finish may split over its programs and whose nucleus may reach below the pool."""
    return (top_p < 1.0) & ((top_k <= 0) | (top_k >= VOCAB)) & (min_p <= 0.0)


@triton.jit
def load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB: tl.constexpr, HAS_BITMASK: tl.constexpr,
                CLEAN: tl.constexpr = True):
    """One vocab tile of a row -> (fp32 logits with NaN/padding/disallowed = -inf, NaN flags,
    raw fp32 logits with NaN/padding = -inf, allowed flags). Without CLEAN, NaNs are left in
    both (`sum_chunk`'s first try: its sums show them)."""
    valid = offs < VOCAB
    raw = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
    is_nan = raw != raw
    if CLEAN:
        raw = tl.where(is_nan, float("-inf"), raw)
    x = raw  # padding already reads as -inf: a select by `offs < VOCAB` would change nothing
    allowed = valid
    if HAS_BITMASK:
        # A step without a bitmask masks the load off: no bytes read, every token allowed.
        words = tl.load(mask_row_ptr + offs // 32, mask=valid & mask_on, other=-1)
        allowed = ((words >> (offs % 32)) & 1) != 0
        x = tl.where(allowed, raw, float("-inf"))
    return x, is_nan, raw, allowed


@triton.jit
def load_four(row_ptr, mask_row_ptr, mask_on, offs, BLOCK: tl.constexpr, VOCAB: tl.constexpr,
              HAS_BITMASK: tl.constexpr):
    """`load_masked` of the four tiles at offs, offs + BLOCK, ... (a step of one program's pass
    over a row), all loaded before the caller uses any: such a pass waits on each step's loads,
    and four keep four times the bytes in flight."""
    return (load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK),
            load_masked(row_ptr, mask_row_ptr, mask_on, offs + BLOCK, VOCAB, HAS_BITMASK),
            load_masked(row_ptr, mask_row_ptr, mask_on, offs + 2 * BLOCK, VOCAB, HAS_BITMASK),
            load_masked(row_ptr, mask_row_ptr, mask_on, offs + 3 * BLOCK, VOCAB, HAS_BITMASK))


@triton.jit
def scan_chunk(row_ptr, mask_row_ptr, mask_on, lo, SPAN: tl.constexpr, VOCAB: tl.constexpr, inv_temp,
               key, thr_key, min_score, DRAW: tl.constexpr, SUM_S: tl.constexpr,
               SUM_R: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """One pass over columns [lo, lo + SPAN) of a row -> (has NaN, max masked logit, its lowest
    id, max Gumbel score, its lowest id, per-lane max masked logit [BLOCK], per-lane max raw
    logit [BLOCK], sum exp(s - max s) over the allowed scores, sum exp(raw - max raw)).

    With DRAW, the Gumbel scores `s + g` of the tokens kept by the thresholds (key of the score
    >= thr_key and score >= min_score); without, the Gumbel result is (-inf, 0). With SUM_S and
    SUM_R, the softmax sums of the scores and of the raw logits, kept per lane relative to the
    lane's running maximum (one exp per element each); without, 0. Per-lane
    running results keep reductions out of the loop; a lane only ever sees increasing ids, so
    strict `>` keeps the lowest id. A maximum of -inf reports id 0: a row without finite scores
    yields 0, and the (max, lowest id) pairs of disjoint chunks combine into exactly the
    whole-row pair."""
    lanes = tl.arange(0, BLOCK)
    any_nan = tl.zeros([BLOCK], tl.int1)
    best_x = tl.full([BLOCK], float("-inf"), tl.float32)
    best_xi = tl.zeros([BLOCK], tl.int32)
    best_z = tl.full([BLOCK], float("-inf"), tl.float32)
    best_zi = tl.zeros([BLOCK], tl.int32)
    best_raw = tl.full([BLOCK], float("-inf"), tl.float32)
    sum_s = tl.zeros([BLOCK], tl.float32)
    sum_r = tl.zeros([BLOCK], tl.float32)
    state = (any_nan, best_x, best_xi, best_z, best_zi, best_raw, sum_s, sum_r)
    for start in range(0, SPAN, 2 * BLOCK):
        state = _scan_pair(row_ptr, mask_row_ptr, mask_on, lo + start + lanes, state, SPAN,
                           VOCAB, inv_temp, key, thr_key, min_score, DRAW, SUM_S, SUM_R, BLOCK,
                           HAS_BITMASK)
    any_nan, best_x, best_xi, best_z, best_zi, best_raw, sum_s, sum_r = state
    if not HAS_BITMASK:
        best_raw = best_x
    has_nan = tl.max(any_nan.to(tl.int32), axis=0)
    max_x, arg_x = max_lowest(best_x, best_xi)
    # Without DRAW the race's lanes stay (-inf, 0): no block-wide reductions of constants.
    max_z = tl.full((), float("-inf"), tl.float32)
    arg_z = tl.zeros((), tl.int32)
    if DRAW:
        max_z, arg_z = max_lowest(best_z, best_zi)
    mass_s = tl.zeros((), tl.float32)
    mass_r = tl.zeros((), tl.float32)
    if SUM_S:
        mass_s = _lanes_mass(best_x * inv_temp, sum_s)
    if SUM_R:
        mass_r = _lanes_mass(best_raw, sum_r)
    return has_nan, max_x, arg_x, max_z, arg_z, best_x, best_raw, mass_s, mass_r


@triton.jit
def _scan_pair(row_ptr, mask_row_ptr, mask_on, offs_a, state, SPAN: tl.constexpr,
               VOCAB: tl.constexpr, inv_temp, key, thr_key, min_score, DRAW: tl.constexpr,
               SUM_S: tl.constexpr, SUM_R: tl.constexpr, BLOCK: tl.constexpr,
               HAS_BITMASK: tl.constexpr):
    """Two tiles of `scan_chunk`, both loaded before either is used: twice the bytes in flight
    per thread without doubling the per-lane state (the running maxima)."""
    any_nan, best_x, best_xi, best_z, best_zi, best_raw, sum_s, sum_r = state
    offs_b = second_tile(offs_a, SPAN, VOCAB, BLOCK)
    xa, nan_a, raw_a, _a = load_masked(row_ptr, mask_row_ptr, mask_on, offs_a, VOCAB,
                                       HAS_BITMASK)
    xb, nan_b, raw_b, _b = load_masked(row_ptr, mask_row_ptr, mask_on, offs_b, VOCAB,
                                       HAS_BITMASK)
    any_nan = any_nan | nan_a | nan_b
    sum_s, sum_r = _add_mass(xa, raw_a, best_x, best_raw, sum_s, sum_r, inv_temp, SUM_S,
                             SUM_R, HAS_BITMASK)
    best_x, best_xi, best_z, best_zi, best_raw = _scan_tile(
        xa, raw_a, offs_a, best_x, best_xi, best_z, best_zi, best_raw, inv_temp, key,
        thr_key, min_score, DRAW, HAS_BITMASK)
    sum_s, sum_r = _add_mass(xb, raw_b, best_x, best_raw, sum_s, sum_r, inv_temp, SUM_S,
                             SUM_R, HAS_BITMASK)
    best_x, best_xi, best_z, best_zi, best_raw = _scan_tile(
        xb, raw_b, offs_b, best_x, best_xi, best_z, best_zi, best_raw, inv_temp, key,
        thr_key, min_score, DRAW, HAS_BITMASK)
    return any_nan, best_x, best_xi, best_z, best_zi, best_raw, sum_s, sum_r


@triton.jit
def scan_span(row_ptr, mask_row_ptr, mask_on, lo, inv_temp, key, DRAW: tl.constexpr,
              SUM_S: tl.constexpr, SUM_R: tl.constexpr, SPAN: tl.constexpr, VOCAB: tl.constexpr,
              BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """`scan_chunk` over columns [lo, lo + SPAN) with no thresholds: a chunk's streaming pass,
    or with SPAN = VOCAB the whole row's. A pass that keeps the raw logits' sum alone (a
    logprob row's: no race, no scores' sum) in the lean variant (no bitmask support) is
    `sum_chunk`'s, which no other row's pass shares, so its sums need not round as
    `scan_chunk`'s. The variant with bitmask support keeps `scan_chunk` for it: `sum_chunk`
    there took 184 registers instead of 103 (one program per SM instead of two), so in a step
    with a bitmask a logprob row's sum may differ in its last bits, which only the reported
    logprobs can show (no token depends on it)."""
    if sums_in_steps(DRAW, SUM_S, SUM_R, HAS_BITMASK):
        res = sum_chunk(row_ptr, lo, SPAN, VOCAB, BLOCK)
    else:
        res = scan_chunk(row_ptr, mask_row_ptr, mask_on, lo, SPAN, VOCAB, inv_temp, key,
                         tl.full((), 0, tl.uint32), float("-inf"), DRAW, SUM_S, SUM_R, BLOCK,
                         HAS_BITMASK)
    return res


@triton.jit
def sum_chunk(row_ptr, lo, SPAN: tl.constexpr, VOCAB: tl.constexpr, BLOCK: tl.constexpr):
    """`scan_chunk`'s results for a logprob row's pass in the lean variant (the raw logits' sum,
    no race, no bitmask) in steps of SUM_STEP tiles loaded at once: each lane's maximum over a
    step first, then its sum rescaled once per step and one exp and one add per element, where
    `scan_chunk` rescales at every element (a compare, a select and a multiply more). NaNs are
    not cleaned per element: a NaN makes its lane's sum NaN, and only then is the span read
    again with NaNs as -inf."""
    res = sum_steps(row_ptr, lo, SPAN, VOCAB, BLOCK, False)
    if res[0] != 0:
        res = sum_steps(row_ptr, lo, SPAN, VOCAB, BLOCK, True)
    return res


@triton.jit
def sum_steps(row_ptr, lo, SPAN: tl.constexpr, VOCAB: tl.constexpr, BLOCK: tl.constexpr,
              CLEAN: tl.constexpr):
    """`sum_chunk` over steps of STEP tiles of BLOCK columns (SPAN a multiple of STEP *
    BLOCK). With CLEAN, NaNs read as -inf and the first result is the NaN flag; without, it is
    1 when a lane's sum is NaN (a NaN, or +inf, in the lane), else 0 (no NaN)."""
    STEP: tl.constexpr = sum_step(SPAN // BLOCK)
    tl.static_assert(SPAN % (STEP * BLOCK) == 0, "a span of whole steps of tiles")
    any_nan = tl.zeros([BLOCK], tl.int32)
    best_x = tl.full([BLOCK], float("-inf"), tl.float32)
    best_xi = tl.zeros([BLOCK], tl.int32)
    sum_r = tl.zeros([BLOCK], tl.float32)
    state = (any_nan, best_x, best_xi, sum_r)
    if CLEAN:
        for start in range(0, SPAN, STEP * BLOCK):
            state = _sum_step(row_ptr, lo + start, state, STEP, VOCAB, BLOCK, CLEAN)
    else:
        # Unrolled: ptxas issues the next steps' loads while it folds one, where a loop waits
        # on every step's loads (BENCHMARKS.md, "A logprob row's pass in steps of four
        # tiles": as a loop the pass was 9% slower than the one it replaced).
        for start in tl.static_range(0, SPAN, STEP * BLOCK):
            state = _sum_step(row_ptr, lo + start, state, STEP, VOCAB, BLOCK, CLEAN)
    any_nan, best_x, best_xi, sum_r = state
    if not CLEAN:
        any_nan = (sum_r != sum_r).to(tl.int32)
    max_x, arg_x = max_lowest(best_x, best_xi)
    no_race = tl.full((), float("-inf"), tl.float32)
    # Every token is allowed: the raw maxima are the masked ones.
    return tl.max(any_nan, axis=0), max_x, arg_x, no_race, tl.zeros((), tl.int32), best_x, \
        best_x, tl.zeros((), tl.float32), _lanes_mass(best_x, sum_r)


@triton.jit
def _sum_step(row_ptr, first, state, STEP: tl.constexpr, VOCAB: tl.constexpr,
              BLOCK: tl.constexpr, CLEAN: tl.constexpr):
    """One step of `sum_steps`: STEP tiles from column `first`, all loaded first, folded into
    the per-lane (NaN flag, maximum, its lowest column, sum). Each tile is a [BLOCK] load of its
    own, so a lane's tiles lie in one thread whatever the dtype (a [STEP, BLOCK] load of 16-bit
    logits spreads them over two warps), and the step's maximum, lowest tile and sum are folded
    in tile order."""
    any_nan, best_x, best_xi, sum_r = state
    lanes = tl.arange(0, BLOCK)
    x, is_nan, _, _ = load_masked(row_ptr, row_ptr, False, first + lanes, VOCAB, False, CLEAN)
    tiles = (x,)
    step_x = x
    for t in tl.static_range(1, STEP):
        x, nan_t, _, _ = load_masked(row_ptr, row_ptr, False, first + t * BLOCK + lanes, VOCAB,
                                     False, CLEAN)
        tiles = tiles + (x,)
        step_x = tl.maximum(step_x, x)
        is_nan = is_nan | nan_t
    if CLEAN:
        any_nan = any_nan | is_nan.to(tl.int32)
    # The lowest tile holding the maximum: ties go to the lowest column.
    tile = tl.zeros([BLOCK], tl.int32)
    for t in tl.static_range(STEP - 1, -1, -1):
        tile = tl.where(tiles[t] == step_x, t, tile)
    better = step_x > best_x
    new_x = tl.where(better, step_x, best_x)
    best_xi = tl.where(better, first + tile * BLOCK + lanes, best_xi)
    ref = _floor_max(new_x)
    mass = exp_neg(ref - tiles[0])
    for t in tl.static_range(1, STEP):
        mass = mass + exp_neg(ref - tiles[t])
    sum_r = sum_r * exp_neg(ref - _floor_max(best_x)) + mass
    return any_nan, new_x, best_xi, sum_r


@triton.jit
def _floor_max(lane_max):
    """A lane's reference for its sum: its maximum, no lower than -FLT_MAX. A lane of only -inf
    then sums exp(-inf) = 0, where -inf - -inf would be NaN."""
    return tl.maximum(lane_max, -3.4028234663852886e38)


# Tiles a logprob row's pass loads at once (`sum_chunk`): a lane's sum is rescaled once per
# step. Two and four timed the same on an H200, in a version that took every sum in steps
# (`benchmarks/results/h200_sum_steps/`, call 2); four is less code.
SUM_STEP = 4


@triton.constexpr_function
def sum_step(tiles):
    return min(SUM_STEP, tiles)


@triton.constexpr_function
def sums_in_steps(draw, sum_s, sum_r, has_bitmask):
    """Whether `scan_span` takes `sum_chunk`: a logprob row's pass (the raw logits' sum
    alone) in the lean variant."""
    return sum_r and not (draw or sum_s or has_bitmask)


@triton.jit
def second_tile(offs_a, SPAN: tl.constexpr, VOCAB: tl.constexpr, BLOCK: tl.constexpr):
    """Columns of the second tile of a two-tile step; past the row (nothing read) when the
    span is a single tile, which would otherwise read the next chunk."""
    if SPAN < 2 * BLOCK:
        return offs_a * 0 + VOCAB
    return offs_a + BLOCK


if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def exp_neg(a):
        return tl.exp(-a)  # the interpreter has no inline PTX
else:
    @triton.jit
    def exp_neg(a):
        """exp(-a) as `tl.exp(-a)` computes it (ex2.approx of -a times the same fp32 log2 e),
        except that results below 2**-126 flush to 0. `tl.exp`'s ex2.approx.f32 keeps them: ptxas
        wraps each MUFU.EX2 in a compare and two predicated multiplies. Triton's -a is 0 - a, an
        instruction of its own, where a * -log2 e folds the sign into the multiply. Together 4
        of the 13 machine instructions per element of a streaming softmax sum
        (`python -m benchmarks.stream_sass`)."""
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f",
                                         [a * -1.4426950408889634], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _online_mass(v, m, acc):
    """Fold values `v` into per-lane sums `acc` of exp(. - m), m the lanes' maxima before `v`:
    a larger value rescales the sum to itself (one exp either way). A lane's sum is 0 or at
    least 1 (its maximum's own term), so the terms below 2**-126 that `exp_neg` drops could not
    change it: the sums are the same as with `tl.exp`.

    `v` and `m` are finite or -inf. A lane that has seen only -inf (m = -inf) has a sum of 0, so
    taking m no lower than -FLT_MAX changes no sum and keeps -inf - -inf (NaN) out of the exp:
    an exp of -inf or of a huge negative is 0 either way. One max where a compare and a select
    on `v` would cost two instructions per element."""
    e = exp_neg(tl.abs(v - tl.maximum(m, -3.4028234663852886e38)))
    return tl.where(v > m, acc * e + 1.0, acc + e)


@triton.jit
def _add_mass(x, raw, best_x, best_raw, sum_s, sum_r, inv_temp, SUM_S: tl.constexpr,
              SUM_R: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """The per-lane softmax sums of `scan_chunk` that it keeps, with one more tile (before its
    maxima)."""
    if SUM_S:
        sum_s = _online_mass(x * inv_temp, best_x * inv_temp, sum_s)
    if SUM_R:
        if HAS_BITMASK:
            sum_r = _online_mass(raw, best_raw, sum_r)
        else:
            sum_r = _online_mass(raw, best_x, sum_r)
    return sum_s, sum_r


@triton.jit
def _lanes_mass(lane_max, lane_sum):
    """sum exp(v - max) over a chunk from its lanes' maxima and sums relative to them."""
    top = tl.max(lane_max, axis=0)
    return tl.sum(tl.where(lane_max > float("-inf"), lane_sum * tl.exp(lane_max - top), 0.0),
                  axis=0)


@triton.jit
def _scan_tile(x, raw, offs, best_x, best_xi, best_z, best_zi, best_raw, inv_temp, key, thr_key,
               min_score, DRAW: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """Fold one loaded tile into the per-lane running results of `scan_chunk`."""
    better = x > best_x
    best_xi = tl.where(better, offs, best_xi)
    best_x = tl.where(better, x, best_x)
    if HAS_BITMASK:
        best_raw = tl.maximum(best_raw, raw)
    if DRAW:
        s = x * inv_temp
        kept = (order_key(s) >= thr_key) & (s >= min_score)
        z = tl.where(kept, s + rng.gumbel(key, offs), float("-inf"))
        better = z > best_z
        best_zi = tl.where(better, offs, best_zi)
        best_z = tl.where(better, z, best_z)
    return best_x, best_xi, best_z, best_zi, best_raw


@triton.jit
def search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, max_score, floor_key,
                     goal, BY_MASS: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr,
                     RADIX_BITS: tl.constexpr):
    """Largest uint32 key T with W(key(s) >= T) >= target, decided RADIX_BITS bits per pass.

    W counts tokens (top-k: target = goal = k), or sums exp(s - max_score) over tokens whose
    key >= floor_key (top-p: target = goal * total mass). W is non-increasing in T, so the
    number of candidate digits meeting the target picks the next digit; the result is exactly
    the k-th largest key, or the smallest kept probability of top-p."""
    RADIX: tl.constexpr = 2**RADIX_BITS
    lanes = tl.arange(0, BLOCK)
    digits = tl.arange(0, RADIX).to(tl.uint32)
    prefix = tl.full((), 0, tl.uint32)
    target = goal
    # A loop, not unrolled: the finish's machine code is a third smaller, and on an H200 every
    # finish ran as fast or faster (BENCHMARKS.md, "Code size of the sampler, timed").
    for p in range(32 // RADIX_BITS):
        shift = 32 - RADIX_BITS * (p + 1)
        cand = prefix | (digits << shift)  # [RADIX]
        acc = tl.zeros([RADIX], tl.float32)
        for start in range(0, VOCAB, BLOCK):
            offs = start + lanes
            x, _, _, _ = load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK)
            s = x * inv_temp
            k = order_key(s)
            if BY_MASS:
                w = tl.where((offs < VOCAB) & (k >= floor_key), tl.exp(s - max_score), 0.0)
            else:
                w = tl.where(offs < VOCAB, 1.0, 0.0)
            hit = k[None, :] >= cand[:, None]  # [RADIX, BLOCK]
            acc += tl.sum(tl.where(hit, w[None, :], 0.0), axis=1)
        if p == 0:
            if BY_MASS:
                # Candidate 0 is key 0: everything, so the largest entry is the total mass.
                target = goal * tl.max(acc, axis=0)
        digit = tl.maximum(tl.sum((acc >= target).to(tl.int32), axis=0) - 1, 0)
        prefix = prefix | (digit.to(tl.uint32) << shift)
    return prefix


@triton.jit
def draw_filtered(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, key, inv_temp, max_x, top_k,
                  top_p, min_p, BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr,
                  HAS_BITMASK: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Gumbel-max token of a random row with filters on, given its max masked logit."""
    use_top_k = (top_k > 0) & (top_k < VOCAB)
    use_top_p = top_p < 1.0
    use_min_p = min_p > 0.0
    no_key = tl.full((), 0, tl.uint32)
    max_score = max_x * inv_temp
    # Without a finite score the row samples token 0 anyway; skip the searches.
    finite = max_score > float("-inf")
    thr = no_key
    if use_top_k & finite:
        thr = search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, max_score, no_key,
                               top_k.to(tl.float32), False, SMALL_BLOCK, HAS_BITMASK, RADIX_BITS)
    if use_top_p & finite:
        thr = search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, max_score, thr, top_p,
                               True, SMALL_BLOCK, HAS_BITMASK, RADIX_BITS)
    # p / p_max = exp(s - s_max), whatever the normalisation.
    min_score = tl.where(use_min_p, max_score + tl.log(tl.where(use_min_p, min_p, 1.0)),
                         float("-inf"))
    token = scan_chunk(row_ptr, mask_row_ptr, mask_on, 0, VOCAB, VOCAB, inv_temp, key, thr,
                       min_score, True, False, False, BLOCK, HAS_BITMASK)[4]
    return token


@triton.jit
def merge_top(best, floor, keys, K_P: tl.constexpr):
    """A running top-K_P of unique 64-bit keys (`best` [K_P] descending, 0 = empty; `floor` its
    smallest) with a tile of keys (0 = none) merged in, only when the tile beats it."""
    if tl.max(keys, axis=0) > floor:
        top = tl.topk(keys, K_P)
        # Descending vs ascending, element-wise max: the K_P largest of both (bitonic).
        best = tl.sort(tl.maximum(best, tl.flip(top, 0)), descending=True)
        floor = tl.min(best, axis=0)
    return best, floor


@triton.jit
def logprob_row(row_ptr, VOCAB: tl.constexpr, token, BLOCK: tl.constexpr, K_P: tl.constexpr):
    """Raw log-softmax facts of one row -> (top-K_P ids [K_P], their logprobs, the token's
    logprob, its rank). The running top-K_P is a sorted list of 64-bit keys (value key, then
    inverted id, so ties rank lower ids first) merged with a tile only when the tile beats it."""
    lanes = tl.arange(0, BLOCK)
    tok_x = tl.load(row_ptr + tl.minimum(tl.maximum(token, 0), VOCAB - 1)).to(tl.float32)
    tok_x = tl.where(tok_x != tok_x, float("-inf"), tok_x)
    run_max = tl.full([BLOCK], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK], tl.float32)
    above = tl.zeros([BLOCK], tl.int32)
    best = tl.zeros([K_P], tl.uint64)  # descending; 0 = empty (every real key is larger)
    floor = tl.full((), 0, tl.uint64)
    for start in range(0, VOCAB, BLOCK):
        offs = start + lanes
        valid = offs < VOCAB
        x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)
        new_max = tl.maximum(run_max, x)
        scale = tl.where(new_max == run_max, 1.0, tl.exp(run_max - new_max))
        run_sum = run_sum * scale + tl.where(x == float("-inf"), 0.0, tl.exp(x - new_max))
        run_max = new_max
        above += (x > tok_x).to(tl.int32)
        inverted_id = offs.to(tl.uint32) ^ 0xFFFFFFFF
        rank_key = (order_key(x).to(tl.uint64) << 32) | inverted_id.to(tl.uint64)
        best, floor = merge_top(best, floor, tl.where(valid, rank_key, 0), K_P)
    row_max = tl.max(run_max, axis=0)
    lane_sum = tl.where(run_max == float("-inf"), 0.0, run_sum * tl.exp(run_max - row_max))
    total = tl.sum(lane_sum, axis=0)
    lse = tl.where(row_max == float("-inf"), 0.0, row_max + tl.log(total))
    empty = best == 0
    ids = ((best & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32, bitcast=True)
    ids = tl.where(empty, -1, ids)
    vals = tl.where(empty, float("-inf"), key_to_float((best >> 32).to(tl.uint32)) - lse)
    rank = 1 + tl.sum(above, axis=0)
    return ids, vals, tok_x - lse, rank
