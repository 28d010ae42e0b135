"""Graph-safe sampling of a sub-batch of requests: split-vocabulary passes, then one program per
request that assembles its record.

Contract
--------
Request `j` owns logits rows `cu_num_logits[j] .. cu_num_logits[j+1]-1` (`m_j` rows, at most the
layout's M; extra rows are ignored). The request count `n` is read from device memory; the grids
are static bounds (`max_num_reqs`) and programs of requests `j >= n` exit at once, so one
compiled set of kernels serves every batch size and padded requests cost nothing. Records past
`n` are not touched.

Per row, with the slot's parameters (`graphshard.params.SlotTables`):
- Only columns `< vocab_size` exist: padding columns are never read, sampled or reported.
- Logits are read as fp32/bf16/fp16 and computed in fp32. NaN counts as -inf; `num_nans` is the
  number of the request's rows with at least one NaN in the real vocabulary.
- The grammar bitmask (bit `t % 32` of word `t // 32` of row `bitmask_rows[row]`) sets
  disallowed tokens to -inf.
- temperature 0: greedy, the argmax of the masked logits, lowest token id on ties; filters are
  ignored.
- temperature > 0: scores `s = logit * (1 / temperature)` in fp32, then in order top-k (keep
  `s >=` the k-th largest `s`; off when `top_k <= 0` or `>= vocab_size`), top-p (keep the
  smallest set of most probable tokens, probabilities normalised over the top-k survivors, whose
  mass reaches `top_p`; ties at the threshold are kept; off when `top_p >= 1`), min-p (keep
  `s >= s_max + log(min_p)`; off when `min_p <= 0`). The token is the Gumbel-max
  `argmax_t s_t + g(seed, position, t)` over the kept tokens (`graphshard.rng`: keyed by seed,
  position and token id only), the position of row `k` being `seq_lens[j] + k`.
- A row with no finite score samples token 0.

Speculative decoding: every row is sampled; drafts (`draft_tokens[row]`, ignored on a request's
last row) are accepted along the longest prefix of rows `0..m-2` whose sample equals the draft.
`num_sampled = accepted + 1` (the last token is the correction or bonus token), `num_rejected =
m - 1 - accepted`, tokens past `num_sampled` are -1. Without drafts nothing is accepted:
`num_sampled = 1`, the sample of row 0.

Logprobs (layout K > 0 and the slot's `num_logprobs > 0`), from the raw logits (fp32
log-softmax over the real vocabulary, before bitmask, temperature and filters), for the rows
`r < num_sampled`: top-K ids and logprobs (descending, ties by lower id), the sampled token's
logprob and rank (1 + number of tokens with a strictly larger raw logit). Entries past the
slot's `num_logprobs`, rows `r >= num_sampled` and slots without logprobs hold id -1, logprob
-inf, sampled logprob -inf and rank 0.

Results land in one packed int32 record per request (`graphshard.records`).

Execution
---------
The vocabulary is cut into chunks of CHUNK columns; every (row, chunk) pair is a program, so a
single row spreads over many SMs. Three launches:
1. `_scan_kernel`, grid `(max_num_reqs * M, SPLITS)`: each program reads its chunk once for the
   greedy argmax, the NaN flag and (random rows that may need it) the unfiltered Gumbel-max
   winner. Rows with filters or logprobs read it a second time (from L2) to capture their
   candidates (`graphshard.sampler_select`) and the softmax sums. The last program of a row to
   finish (an arrival counter) resolves the row: top-k, top-p and min-p thresholds, the draw and
   the top-K logprobs come from the candidates whenever the thresholds lie above every chunk's
   capture floor, which is checked, so the answer is exact or not given.
2. `_verify_kernel`, same grid, work only for rows the candidates could not settle: it counts
   the tokens above the unfiltered winner (that winner is the answer exactly when it survives
   the filters) and above the sampled token (its logprob rank).
3. `_finish_kernel`, grid `(max_num_reqs,)`: verifies drafts and writes each request's record.
   A row still unsettled (adversarial rows: thousands of ties at a threshold, kept sets larger
   than the pool) is sampled here by the whole-row threshold search of `sampler_rows`; the
   workspace counts these rows (`SamplerWorkspace.paths`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphshard import rng
from graphshard.launch import check_int32_vector, launch
from graphshard.params import SLOT_WIDTH, SlotTables
from graphshard.records import RecordLayout
from graphshard.sampler_rows import (draw_filtered, load_masked, logprob_row, scan_chunk,
                                     uses_filters)
from graphshard.sampler_select import (capture, chunk_floor, count_raw_above, draw_pool, fold_lanes,
                                       floor_score, mass_above, search_pool, top_raw, unpack_top)

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK_SIZE = 2048
# Tile of the whole-row fallback paths and of the pool: their wider per-token state would cost
# registers that the streaming passes need for occupancy.
SMALL_BLOCK_SIZE = 512
POOL_TILE = 1024
# Bits of a threshold decided per pass of a radix search: 16 candidates, 8 passes.
RADIX_BITS = 4
# Vocabulary columns per program: a 152K vocabulary spreads over 19 SMs.
CHUNK_SIZE = 8192
# Lane maxima a chunk folds its tile into before picking its capture floor.
FLOOR_LANES = 1024
# Candidates a chunk captures for top-p and min-p (and the largest top-k served by the pool):
# the kept set of most rows lies within the top 128 of each chunk.
CHUNK_TOP = 128
# Pool entries per row and chunk: ~CHUNK_TOP captured plus the lanes' ties, with headroom.
POOL_PER_SPLIT = 192
MAX_POOL = 8192

SLOT_ROW = tl.constexpr(SLOT_WIDTH)
# Per (row, chunk) results, int32 (floats as bits): part[row, field, split].
NUM_PART = tl.constexpr(13)
P_NAN = tl.constexpr(0)  # 1 if the chunk holds a NaN
P_MAX_X = tl.constexpr(1)  # max masked logit
P_ARG_X = tl.constexpr(2)  # its lowest id
P_MAX_Z = tl.constexpr(3)  # max Gumbel score over every allowed token
P_ARG_Z = tl.constexpr(4)  # its lowest id
P_FLOOR_S = tl.constexpr(5)  # allowed tokens below this logit were not captured
P_FLOOR_R = tl.constexpr(6)  # tokens below this raw logit were not captured
P_MAX_R = tl.constexpr(7)  # max raw logit
P_SUM_R = tl.constexpr(8)  # sum exp(raw - chunk max raw)
P_SUM_S = tl.constexpr(9)  # sum exp(s - chunk max s) over allowed tokens
P_CNT_S = tl.constexpr(10)  # verify: allowed tokens with s > v_s
P_MASS_S = tl.constexpr(11)  # verify: their sum exp(s - row max s)
P_CNT_R = tl.constexpr(12)  # verify: tokens with raw > v_r
# Per row state, int32: state[row, field].
NUM_STATE = tl.constexpr(8)
S_TOKEN = tl.constexpr(0)
S_TODO = tl.constexpr(1)  # what later launches owe the row: TODO_* bits
S_V_S = tl.constexpr(2)  # score of the unfiltered winner (TODO_VERIFY)
S_V_R = tl.constexpr(3)  # raw logit of the token whose rank is owed (TODO_RANK)
S_NORM = tl.constexpr(4)  # top-p normalisation mass, relative to the row max score
S_MAX_X = tl.constexpr(5)  # row max masked logit
S_NAN = tl.constexpr(6)
TODO_VERIFY = tl.constexpr(1)  # the unfiltered winner is the token if it survives the filters
TODO_RANK = tl.constexpr(2)  # count raw logits above S_V_R
TODO_DRAW = tl.constexpr(4)  # whole-row filtered draw in _finish_kernel
TODO_LOGPROBS = tl.constexpr(8)  # whole-row logprobs in _finish_kernel
# Counters per row: arrivals of the two split launches and the pool fill. Every launch leaves
# them at zero (the last program of a row resets them), so graph replays need no reset.
NUM_COUNT = tl.constexpr(4)
C_ARRIVE_A = tl.constexpr(0)
C_ARRIVE_B = tl.constexpr(1)
C_POOL = tl.constexpr(2)
# Cumulative counts of how rows were settled: [whole-row draws, whole-row logprobs, draws
# settled by verifying the unfiltered winner, unused].
NUM_STATS = 4


# --------------------------------------------------------------------------- shared set-up


@triton.jit
def _request(num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr, seq_lens_ptr, req, M: tl.constexpr):
    """(live, slot, first logits row, row count m <= M, seq_len) of request `req`."""
    live = req < tl.load(num_reqs_ptr)
    req = tl.where(live, req, 0)
    first_row = tl.load(cu_num_logits_ptr + req)
    m = tl.minimum(tl.load(cu_num_logits_ptr + req + 1) - first_row, M)
    return live, tl.load(req_slots_ptr + req), first_row, m, tl.load(seq_lens_ptr + req)


@triton.jit
def _slot_params(slots_ptr, slot, VOCAB: tl.constexpr, K: tl.constexpr):
    """One slot's row of the packed table -> (temperature, 1 / temperature (1 when greedy),
    top_k, top_p, min_p, seed_lo, seed_hi, logprobs wanted (<= K), random, filtered)."""
    row = slots_ptr + slot * SLOT_ROW
    temperature = tl.load(row).to(tl.float32, bitcast=True)
    top_k = tl.load(row + 1)
    top_p = tl.load(row + 2).to(tl.float32, bitcast=True)
    min_p = tl.load(row + 3).to(tl.float32, bitcast=True)
    num_logprobs = tl.minimum(tl.load(row + 6), K)
    is_random = temperature > 0.0
    inv_temp = 1.0 / tl.where(is_random, temperature, 1.0)
    filtered = is_random & uses_filters(top_k, top_p, min_p, VOCAB)
    return (temperature, inv_temp, top_k, top_p, min_p, tl.load(row + 4), tl.load(row + 5),
            num_logprobs, is_random, filtered)


@triton.jit
def _bitmask_row(bitmask_ptr, bitmask_stride, bitmask_rows_ptr, bitmask_on_ptr, row,
                 HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr):
    """(pointer to the row's bitmask words, whether the bitmask applies this step)."""
    mask_on = True
    if HAS_BITMASK_FLAG:
        mask_on = tl.load(bitmask_on_ptr) != 0
    mask_row_ptr = bitmask_ptr
    if HAS_BITMASK:
        mask_row_ptr = bitmask_ptr + tl.load(bitmask_rows_ptr + row).to(tl.int64) * bitmask_stride
    return mask_row_ptr, mask_on


@triton.jit
def _workspace(ws_ptr, row_id, ROWS: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr):
    """Pointers to one row's sections of the workspace: (partials [NUM_PART, SPLITS], state,
    counters, pool logits [CAP], pool ids [CAP], stats)."""
    row_id = row_id.to(tl.int64)
    part = ws_ptr + row_id * (NUM_PART * SPLITS)
    state = ws_ptr + ROWS * NUM_PART * SPLITS + row_id * NUM_STATE
    count = ws_ptr + ROWS * (NUM_PART * SPLITS + NUM_STATE) + row_id * NUM_COUNT
    pool_base = ws_ptr + ROWS * (NUM_PART * SPLITS + NUM_STATE + NUM_COUNT)
    stats = pool_base + ROWS * 2 * CAP
    return part, state, count, pool_base + row_id * CAP, pool_base + (ROWS + row_id) * CAP, stats


@triton.jit
def _arrive(counter_ptr, SPLITS: tl.constexpr):
    """Count this program in; True for the row's last program, which then sees every other
    program's stores (release/acquire at GPU scope) and resets the counter for the next launch."""
    tl.debug_barrier()
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == SPLITS - 1
    if last:
        tl.store(counter_ptr, 0)
    tl.debug_barrier()
    return last


@triton.jit
def _combine_max(part_ptr, VAL: tl.constexpr, ARG: tl.constexpr, SPLITS: tl.constexpr,
                 SPLITS_P: tl.constexpr):
    """(max, lowest id at it) of a row from its chunks' (max, lowest id at the chunk max) pairs."""
    splits = tl.arange(0, SPLITS_P)
    live = splits < SPLITS
    vals = tl.load(part_ptr + VAL * SPLITS + splits, mask=live, other=0, cache_modifier=".cg")
    vals = tl.where(live, vals.to(tl.float32, bitcast=True), float("-inf"))
    ids = tl.load(part_ptr + ARG * SPLITS + splits, mask=live, other=2147483647,
                  cache_modifier=".cg")
    best = tl.max(vals, axis=0)
    return best, tl.min(tl.where(vals == best, ids, 2147483647), axis=0)


@triton.jit
def _load_part(part_ptr, FIELD: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P: tl.constexpr,
               other, AS_FLOAT: tl.constexpr):
    splits = tl.arange(0, SPLITS_P)
    vals = tl.load(part_ptr + FIELD * SPLITS + splits, mask=splits < SPLITS, other=0,
                   cache_modifier=".cg")
    if AS_FLOAT:
        return tl.where(splits < SPLITS, vals.to(tl.float32, bitcast=True), other)
    return tl.where(splits < SPLITS, vals, other)


@triton.jit
def _softmax_mass(part_ptr, MAX: tl.constexpr, SUM: tl.constexpr, row_max, scale,
                  SPLITS: tl.constexpr, SPLITS_P: tl.constexpr):
    """sum_c sum_c' exp(v - row_max) from the chunks' (max m_c, sum exp(v - m_c * scale))."""
    maxes = _load_part(part_ptr, MAX, SPLITS, SPLITS_P, float("-inf"), True) * scale
    sums = _load_part(part_ptr, SUM, SPLITS, SPLITS_P, 0.0, True)
    w = tl.where(maxes > float("-inf"), sums * tl.exp(maxes - row_max), 0.0)
    return tl.sum(w, axis=0)


@triton.jit
def _store_logprobs(rec_ptr, r, ids, vals, token_logprob, rank, num, M: tl.constexpr,
                    K: tl.constexpr, K_P: tl.constexpr):
    """Row r's logprob fields; entries past `num` are empty."""
    at = tl.arange(0, K_P)
    keep = at < num
    out = rec_ptr + M + 3 + r * K + at
    tl.store(out, tl.where(keep, ids, -1), mask=at < K)
    vals = tl.where(keep, vals, float("-inf"))
    tl.store(out + M * K, vals.to(tl.int32, bitcast=True), mask=at < K)
    tl.store(rec_ptr + M + 3 + 2 * M * K + r, token_logprob.to(tl.int32, bitcast=True))
    tl.store(rec_ptr + M + 3 + 2 * M * K + M + r, rank)


# --------------------------------------------------------------------------- launch 1: scan


@triton.jit
def _resolve(part, state, count, pool_x, pool_id, rec_ptr, row_ptr, r, key, inv_temp, top_k,
             top_p, min_p, num_logprobs, is_random, filtered, small_k,
             VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
             SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, CAP: tl.constexpr,
             TILE: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Settle a row from its chunks' results and its pool, or record what later launches owe."""
    has_nan = tl.max(_load_part(part, P_NAN, SPLITS, SPLITS_P, 0, False), axis=0)
    max_x, token = _combine_max(part, P_MAX_X, P_ARG_X, SPLITS, SPLITS_P)
    max_s = max_x * inv_temp
    n_pool = tl.load(count + C_POOL, cache_modifier=".cg")
    n_cand = tl.minimum(n_pool, CAP)
    whole = n_pool <= CAP  # every capture reached the pool
    todo = tl.full((), 0, tl.int32)
    norm = tl.full((), 0.0, tl.float32)
    if is_random:
        # No finite score: every chunk reports (-inf, 0), so the winner is token 0.
        token = _combine_max(part, P_MAX_Z, P_ARG_Z, SPLITS, SPLITS_P)[1]
        if filtered & (max_s > float("-inf")):
            todo, norm, token = _resolve_filtered(part, state, pool_x, pool_id, n_cand, whole,
                                                  row_ptr, token, key, inv_temp, max_s, top_k,
                                                  top_p, min_p, small_k, VOCAB, SPLITS, SPLITS_P,
                                                  CAP, TILE, RADIX_BITS)
    if K > 0:
        if num_logprobs > 0:
            todo = _resolve_logprobs(part, state, pool_x, pool_id, n_cand, whole, rec_ptr,
                                     row_ptr, r, token, todo, num_logprobs, M, K, K_P, SPLITS,
                                     SPLITS_P, CAP, TILE)
    tl.store(state + S_TOKEN, token)
    tl.store(state + S_TODO, todo)
    tl.store(state + S_NORM, norm.to(tl.int32, bitcast=True))
    tl.store(state + S_MAX_X, max_x.to(tl.int32, bitcast=True))
    tl.store(state + S_NAN, has_nan)
    tl.store(count + C_POOL, 0)


@triton.jit
def _resolve_filtered(part, state, pool_x, pool_id, n_cand, whole, row_ptr, w0, key, inv_temp,
                      max_s, top_k, top_p, min_p, small_k, VOCAB: tl.constexpr,
                      SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, CAP: tl.constexpr,
                      TILE: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Filtered draw from the pool when every kept token is in it -> (todo, top-p norm, token).
    Otherwise the unfiltered winner `w0` is checked (TODO_VERIFY) or the row is owed a
    whole-row draw (TODO_DRAW)."""
    floor_x = tl.max(_load_part(part, P_FLOOR_S, SPLITS, SPLITS_P, float("-inf"), True), axis=0)
    below = floor_score(floor_x, inv_temp)  # the best score an uncaptured token can have
    all_in = whole & (floor_x == float("-inf"))  # every finite allowed token was captured
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
    norm = _softmax_mass(part, P_MAX_X, P_SUM_S, max_s, inv_temp, SPLITS, SPLITS_P)
    if use_top_k & use_top_p:
        norm = mass_above(pool_x, pool_id, n_cand, inv_temp, max_s, thr, CAP, TILE)
    ok = k_ok
    if use_top_p & k_ok:
        t_p = search_pool(pool_x, pool_id, n_cand, inv_temp, max_s, thr, top_p * norm, True,
                          CAP, TILE, RADIX_BITS)[0]
        ok = t_p > below
        thr = tl.maximum(thr, t_p)
    t_m = max_s + tl.log(tl.where(min_p > 0.0, min_p, 1.0))
    thr = tl.where(min_p > 0.0, tl.maximum(thr, t_m), thr)
    ok = ok & whole & ((thr > below) | all_in)
    todo = tl.full((), 0, tl.int32)
    token = w0
    if ok:
        token = draw_pool(pool_x, pool_id, n_cand, inv_temp, thr, key, CAP, TILE)[1]
    elif small_k:
        todo = todo | TODO_DRAW  # such rows skip the unfiltered winner
    else:
        # The unfiltered winner is the answer exactly when it survives the filters: min-p is
        # checked here, top-k and top-p by counting above it in launch 2 (which needs the
        # top-p norm, so a top-k it depends on must be settled).
        v_s = tl.load(row_ptr + w0).to(tl.float32) * inv_temp
        survives = ((min_p <= 0.0) | (v_s >= t_m)) & (k_ok | ~use_top_p)
        todo = todo | tl.where(survives, TODO_VERIFY, TODO_DRAW)
        tl.store(state + S_V_S, v_s.to(tl.int32, bitcast=True))
    return todo, norm, token


@triton.jit
def _resolve_logprobs(part, state, pool_x, pool_id, n_cand, whole, rec_ptr, row_ptr, r, token,
                      todo, num, M: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
                      SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, CAP: tl.constexpr,
                      TILE: tl.constexpr):
    """Top-K and the token's logprob from the pool when it holds every token they need; the
    rank when the token lies above every floor. Returns `todo` with what is still owed."""
    max_r = tl.max(_load_part(part, P_MAX_R, SPLITS, SPLITS_P, float("-inf"), True), axis=0)
    total = _softmax_mass(part, P_MAX_R, P_SUM_R, max_r, 1.0, SPLITS, SPLITS_P)
    lse = tl.where(max_r == float("-inf"), 0.0, max_r + tl.log(total))
    floor_r = tl.max(_load_part(part, P_FLOOR_R, SPLITS, SPLITS_P, float("-inf"), True), axis=0)
    ids, vals, xs = unpack_top(top_raw(pool_x, pool_id, n_cand, CAP, TILE, K_P), lse)
    at = tl.arange(0, K_P)
    last_x = tl.max(tl.where(at == num - 1, xs, float("-inf")), axis=0)
    last_id = tl.max(tl.where(at == num - 1, ids, -1), axis=0)
    # The list is exact when its last needed entry lies at or above every floor.
    list_ok = whole & (last_id >= 0) & (last_x > float("-inf")) & (last_x >= floor_r)
    tok_x = tl.load(row_ptr + token).to(tl.float32)
    tok_x = tl.where(tok_x != tok_x, float("-inf"), tok_x)
    rank_ok = whole & (tok_x >= floor_r)
    rank = 1 + count_raw_above(pool_x, pool_id, n_cand, tok_x, CAP, TILE)
    if (todo & TODO_DRAW) != 0:
        todo = todo | TODO_LOGPROBS
    elif list_ok:
        _store_logprobs(rec_ptr, r, ids, vals, tok_x - lse, rank, num, M, K, K_P)
        if ~rank_ok:
            todo = todo | TODO_RANK
            tl.store(state + S_V_R, tok_x.to(tl.int32, bitcast=True))
    else:
        todo = todo | TODO_LOGPROBS
    return todo


# logits_stride stays specialised: the engine's logits buffer fixes it, and a stride divisible
# by 16 lets the row loads vectorise. Nothing that varies per step is an int argument.
@triton.jit(do_not_specialize=["bitmask_stride", "records_stride"])
def _scan_kernel(
    logits_ptr,  # [num_rows, padded_vocab] fp32/bf16/fp16
    logits_stride,
    num_reqs_ptr,  # [1] int32: n
    req_slots_ptr,  # [>= n] int32
    cu_num_logits_ptr,  # [>= n + 1] int32
    seq_lens_ptr,  # [>= n] int32
    bitmask_ptr,  # [num_bitmask_rows, ceil(vocab / 32)] int32 (HAS_BITMASK)
    bitmask_stride,
    bitmask_rows_ptr,  # [num_rows] int32 (HAS_BITMASK)
    bitmask_on_ptr,  # [1] int32: 0 = this step has no bitmask (HAS_BITMASK_FLAG)
    slots_ptr,  # [max_num_slots, SLOT_WIDTH] int32, packed SlotTables
    ws_ptr,  # workspace, see _workspace
    records_ptr,  # [>= n, width] int32
    records_stride,
    VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
    CHUNK: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, ROWS: tl.constexpr,
    CAP: tl.constexpr, TILE: tl.constexpr, LANES: tl.constexpr, TOP: tl.constexpr,
    BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    row_id = tl.program_id(0)
    req = row_id // M
    r = row_id % M
    live, slot, first_row, m, seq_len = _request(num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr,
                                                 seq_lens_ptr, req, M)
    if live & (r < m):
        split = tl.program_id(1)
        row = first_row + r
        (temperature, inv_temp, top_k, top_p, min_p, seed_lo, seed_hi, num_logprobs, is_random,
         filtered) = _slot_params(slots_ptr, slot, VOCAB, K)
        small_k = filtered & (top_k > 0) & (top_k <= TOP)
        # The unfiltered winner: the draw of an unfiltered row, the candidate of a filtered one.
        draw = is_random & ~small_k
        want_lp = num_logprobs > 0
        need_s = tl.where(filtered, tl.where(small_k, top_k, TOP), 0)
        need_r = tl.where(want_lp, tl.maximum(num_logprobs, tl.where(small_k, top_k, 0)), 0)
        mask_row_ptr, mask_on = _bitmask_row(bitmask_ptr, bitmask_stride, bitmask_rows_ptr,
                                             bitmask_on_ptr, row, HAS_BITMASK, HAS_BITMASK_FLAG)
        row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
        key = rng.row_key(seed_lo, seed_hi, seq_len + r)
        lo = split * CHUNK
        no_key = tl.full((), 0, tl.uint32)
        if draw:
            has_nan, max_x, arg_x, max_z, arg_z, lane_x, lane_r = scan_chunk(
                row_ptr, mask_row_ptr, mask_on, lo, CHUNK, VOCAB, inv_temp, key, no_key,
                float("-inf"), True, BLOCK, HAS_BITMASK)
        else:
            has_nan, max_x, arg_x, max_z, arg_z, lane_x, lane_r = scan_chunk(
                row_ptr, mask_row_ptr, mask_on, lo, CHUNK, VOCAB, inv_temp, key, no_key,
                float("-inf"), False, BLOCK, HAS_BITMASK)
        max_r = tl.max(lane_r, axis=0)
        floor_s = tl.full((), float("inf"), tl.float32)
        floor_r = tl.full((), float("inf"), tl.float32)
        sum_s = tl.full((), 0.0, tl.float32)
        sum_r = tl.full((), 0.0, tl.float32)
        if (need_s > 0) | (need_r > 0):
            separate = False
            if HAS_BITMASK:
                separate = mask_on
            if separate:
                floor_s = tl.where(need_s > 0, chunk_floor(fold_lanes(lane_x, BLOCK, LANES), need_s,
                                                           LANES, TOP), float("inf"))
                floor_r = tl.where(need_r > 0, chunk_floor(fold_lanes(lane_r, BLOCK, LANES), need_r,
                                                           LANES, TOP), float("inf"))
            else:
                floor_s = chunk_floor(fold_lanes(lane_x, BLOCK, LANES),
                                      tl.maximum(need_s, need_r), LANES, TOP)
                floor_r = floor_s
            sum_s, sum_r = _sweep(row_ptr, mask_row_ptr, mask_on, lo, ws_ptr, row_id, inv_temp,
                                  floor_s, floor_r, max_x * inv_temp, max_r,
                                  filtered & (top_p < 1.0) & ~small_k, want_lp, VOCAB, CHUNK,
                                  ROWS, SPLITS, CAP, BLOCK, HAS_BITMASK)
        part, state, count, pool_x, pool_id, stats = _workspace(ws_ptr, row_id, ROWS, SPLITS, CAP)
        out = part + split
        tl.store(out + P_NAN * SPLITS, has_nan)
        tl.store(out + P_MAX_X * SPLITS, max_x.to(tl.int32, bitcast=True))
        tl.store(out + P_ARG_X * SPLITS, arg_x)
        tl.store(out + P_MAX_Z * SPLITS, max_z.to(tl.int32, bitcast=True))
        tl.store(out + P_ARG_Z * SPLITS, arg_z)
        tl.store(out + P_FLOOR_S * SPLITS, floor_s.to(tl.int32, bitcast=True))
        tl.store(out + P_FLOOR_R * SPLITS, floor_r.to(tl.int32, bitcast=True))
        tl.store(out + P_MAX_R * SPLITS, max_r.to(tl.int32, bitcast=True))
        tl.store(out + P_SUM_R * SPLITS, sum_r.to(tl.int32, bitcast=True))
        tl.store(out + P_SUM_S * SPLITS, sum_s.to(tl.int32, bitcast=True))
        if _arrive(count + C_ARRIVE_A, SPLITS):
            rec_ptr = records_ptr + req.to(tl.int64) * records_stride
            _resolve(part, state, count, pool_x, pool_id, rec_ptr, row_ptr, r, key,
                     inv_temp, top_k, top_p, min_p, num_logprobs, is_random, filtered, small_k,
                     VOCAB, M, K, K_P, SPLITS, SPLITS_P, CAP, TILE, RADIX_BITS)


@triton.jit
def _sweep(row_ptr, mask_row_ptr, mask_on, lo, ws_ptr, row_id, inv_temp, floor_s, floor_r,
           max_s, max_r, SUM_S, SUM_R, VOCAB: tl.constexpr, CHUNK: tl.constexpr,
           ROWS: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
           HAS_BITMASK: tl.constexpr):
    """Second pass over a chunk (from L2): capture the tokens at or above the floors into the
    row's pool, and the softmax sums relative to the chunk maxima -> (sum_s, sum_r)."""
    count, pool_x, pool_id = _workspace(ws_ptr, row_id, ROWS, SPLITS, CAP)[2:5]
    lanes = tl.arange(0, BLOCK)
    acc_s = tl.zeros([BLOCK], tl.float32)
    acc_r = tl.zeros([BLOCK], tl.float32)
    for start in range(0, CHUNK, BLOCK):
        offs = lo + start + lanes
        x, nan, raw, allowed = load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK)
        finite = raw > float("-inf")
        take = finite & ((allowed & (raw >= floor_s)) | (raw >= floor_r))
        capture(pool_x, pool_id, count + C_POOL, raw, allowed, offs, take, CAP)
        if SUM_S:
            acc_s += tl.where(x > float("-inf"), tl.exp(x * inv_temp - max_s), 0.0)
        if SUM_R:
            acc_r += tl.where(finite, tl.exp(raw - max_r), 0.0)
    return tl.sum(acc_s, axis=0), tl.sum(acc_r, axis=0)


# --------------------------------------------------------------------------- launch 2: verify


@triton.jit(do_not_specialize=["bitmask_stride", "records_stride"])
def _verify_kernel(
    logits_ptr, logits_stride, num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr, seq_lens_ptr,
    bitmask_ptr, bitmask_stride, bitmask_rows_ptr, bitmask_on_ptr, slots_ptr, ws_ptr,
    records_ptr, records_stride,  # as _scan_kernel
    VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr,
    SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, ROWS: tl.constexpr, CAP: tl.constexpr,
    BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr,
):
    row_id = tl.program_id(0)
    req = row_id // M
    r = row_id % M
    live, slot, first_row, m, seq_len = _request(num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr,
                                                 seq_lens_ptr, req, M)
    part, state, count, pool_x, pool_id, stats = _workspace(ws_ptr, row_id, ROWS, SPLITS, CAP)
    todo = tl.load(state + S_TODO, mask=live & (r < m), other=0)
    if (todo & (TODO_VERIFY | TODO_RANK)) != 0:
        split = tl.program_id(1)
        row = first_row + r
        (temperature, inv_temp, top_k, top_p, min_p, seed_lo, seed_hi, num_logprobs, is_random,
         filtered) = _slot_params(slots_ptr, slot, VOCAB, K)
        mask_row_ptr, mask_on = _bitmask_row(bitmask_ptr, bitmask_stride, bitmask_rows_ptr,
                                             bitmask_on_ptr, row, HAS_BITMASK, HAS_BITMASK_FLAG)
        row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
        v_s = tl.load(state + S_V_S).to(tl.float32, bitcast=True)
        v_s = tl.where((todo & TODO_VERIFY) != 0, v_s, float("inf"))
        v_r = tl.load(state + S_V_R).to(tl.float32, bitcast=True)
        v_r = tl.where((todo & TODO_RANK) != 0, v_r, float("inf"))
        max_s = tl.load(state + S_MAX_X).to(tl.float32, bitcast=True) * inv_temp
        lanes = tl.arange(0, BLOCK)
        cnt_s = tl.zeros([BLOCK], tl.int32)
        mass_s = tl.zeros([BLOCK], tl.float32)
        cnt_r = tl.zeros([BLOCK], tl.int32)
        for start in range(0, CHUNK, BLOCK):
            offs = split * CHUNK + start + lanes
            x, nan, raw, allowed = load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB,
                                               HAS_BITMASK)
            s = x * inv_temp
            above = (x > float("-inf")) & (s > v_s)
            cnt_s += above.to(tl.int32)
            mass_s += tl.where(above, tl.exp(s - max_s), 0.0)
            cnt_r += (raw > v_r).to(tl.int32)
        out = part + split
        tl.store(out + P_CNT_S * SPLITS, tl.sum(cnt_s, axis=0))
        tl.store(out + P_MASS_S * SPLITS, tl.sum(mass_s, axis=0).to(tl.int32, bitcast=True))
        tl.store(out + P_CNT_R * SPLITS, tl.sum(cnt_r, axis=0))
        if _arrive(count + C_ARRIVE_B, SPLITS):
            above_s = tl.sum(_load_part(part, P_CNT_S, SPLITS, SPLITS_P, 0, False), axis=0)
            above_mass = tl.sum(_load_part(part, P_MASS_S, SPLITS, SPLITS_P, 0.0, True), axis=0)
            above_r = tl.sum(_load_part(part, P_CNT_R, SPLITS, SPLITS_P, 0, False), axis=0)
            norm = tl.load(state + S_NORM).to(tl.float32, bitcast=True)
            use_top_k = (top_k > 0) & (top_k < VOCAB)
            # A token is kept iff fewer than k tokens, and less than top_p of the mass, lie
            # strictly above it.
            kept = (~use_top_k | (above_s < top_k)) & ((top_p >= 1.0) | (above_mass < top_p * norm))
            if (todo & TODO_VERIFY) != 0:
                if kept:
                    tl.atomic_add(stats + 2, 1, sem="relaxed")
                else:
                    todo = todo | TODO_DRAW
                    if num_logprobs > 0:
                        todo = todo | TODO_LOGPROBS
            if ((todo & TODO_RANK) != 0) & ((todo & TODO_DRAW) == 0):
                rec_ptr = records_ptr + req.to(tl.int64) * records_stride
                tl.store(rec_ptr + M + 3 + 2 * M * K + M + r, 1 + above_r)
            tl.store(state + S_TODO, todo & ~(TODO_VERIFY | TODO_RANK))


# --------------------------------------------------------------------------- launch 3: records


@triton.jit(do_not_specialize=["bitmask_stride", "records_stride"])
def _finish_kernel(
    logits_ptr, logits_stride, num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr, seq_lens_ptr,
    bitmask_ptr, bitmask_stride, bitmask_rows_ptr, bitmask_on_ptr, slots_ptr, ws_ptr,
    records_ptr, records_stride,  # as _scan_kernel
    draft_ptr,  # [num_rows] int32 (HAS_DRAFTS)
    VOCAB: tl.constexpr, M: tl.constexpr, M_P: tl.constexpr, K: tl.constexpr,
    K_P: tl.constexpr, SPLITS: tl.constexpr, ROWS: tl.constexpr, CAP: tl.constexpr,
    HAS_DRAFTS: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr,
    BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    req = tl.program_id(0)
    live, slot, first_row, m, seq_len = _request(num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr,
                                                 seq_lens_ptr, req, M)
    if live:
        (temperature, inv_temp, top_k, top_p, min_p, seed_lo, seed_hi, num_logprobs, is_random,
         filtered) = _slot_params(slots_ptr, slot, VOCAB, K)
        stats = _workspace(ws_ptr, req * M, ROWS, SPLITS, CAP)[5]
        row_ids = tl.arange(0, M_P)
        samples = tl.full([M_P], -1, tl.int32)
        accepted = m - 1
        stopped = 0
        num_nans = 0
        for r in range(0, M):
            if r < m:
                row = first_row + r
                state = _workspace(ws_ptr, req * M + r, ROWS, SPLITS, CAP)[1]
                token = tl.load(state + S_TOKEN)
                num_nans += tl.load(state + S_NAN)
                # Past the first rejection nothing more is owed.
                if (stopped == 0) & ((tl.load(state + S_TODO) & TODO_DRAW) != 0):
                    mask_row_ptr, mask_on = _bitmask_row(bitmask_ptr, bitmask_stride,
                                                         bitmask_rows_ptr, bitmask_on_ptr, row,
                                                         HAS_BITMASK, HAS_BITMASK_FLAG)
                    max_x = tl.load(state + S_MAX_X).to(tl.float32, bitcast=True)
                    token = draw_filtered(logits_ptr + row.to(tl.int64) * logits_stride,
                                          mask_row_ptr, mask_on, VOCAB,
                                          rng.row_key(seed_lo, seed_hi, seq_len + r), inv_temp,
                                          max_x, top_k, top_p, min_p, BLOCK, SMALL_BLOCK,
                                          HAS_BITMASK, RADIX_BITS)
                    tl.atomic_add(stats, 1, sem="relaxed")
                samples = tl.where(row_ids == r, token, samples)
                draft = -1
                if HAS_DRAFTS:
                    draft = tl.load(draft_ptr + row)
                reject = (stopped == 0) & (r < m - 1) & (token != draft)
                accepted = tl.where(reject, r, accepted)
                stopped = tl.where(reject, 1, stopped)
        rec_ptr = records_ptr + req.to(tl.int64) * records_stride
        tl.store(rec_ptr + row_ids, tl.where(row_ids <= accepted, samples, -1), mask=row_ids < M)
        tl.store(rec_ptr + M, accepted + 1)
        tl.store(rec_ptr + M + 1, m - 1 - accepted)
        tl.store(rec_ptr + M + 2, num_nans)
        if K > 0:
            for r in range(0, M):
                empty = tl.full([K_P], -1, tl.int32)
                if (r <= accepted) & (num_logprobs > 0):
                    state = _workspace(ws_ptr, req * M + r, ROWS, SPLITS, CAP)[1]
                    if (tl.load(state + S_TODO) & (TODO_DRAW | TODO_LOGPROBS)) != 0:
                        row_ptr = logits_ptr + (first_row + r).to(tl.int64) * logits_stride
                        token = tl.sum(tl.where(row_ids == r, samples, 0), axis=0)
                        ids, vals, token_logprob, rank = logprob_row(row_ptr, VOCAB, token,
                                                                     SMALL_BLOCK, K_P)
                        _store_logprobs(rec_ptr, r, ids, vals, token_logprob, rank,
                                        num_logprobs, M, K, K_P)
                        tl.atomic_add(stats + 1, 1, sem="relaxed")
                else:
                    _store_logprobs(rec_ptr, r, empty, empty.to(tl.float32),
                                    tl.full((), float("-inf"), tl.float32),
                                    tl.full((), 0, tl.int32), 0, M, K, K_P)


# --------------------------------------------------------------------------- host side


def _chunk_size(vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return min(CHUNK_SIZE, max(16, triton.next_power_of_2(vocab_size)))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 16 \
            or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size!r}")
    return chunk_size


def _sections(rows: int, splits: int, pool: int) -> dict[str, int]:
    """Sizes of the workspace sections, in the order `_workspace` lays them out."""
    return {"partials": rows * NUM_PART.value * splits, "state": rows * NUM_STATE.value,
            "counters": rows * NUM_COUNT.value, "pool": rows * 2 * pool, "stats": NUM_STATS}


def _pool_size(splits: int, pool_size: int | None) -> int:
    if pool_size is None:
        return min(MAX_POOL, triton.next_power_of_2(splits * POOL_PER_SPLIT))
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 16 \
            or pool_size & (pool_size - 1):
        raise ValueError(f"pool_size must be a power of two >= 16, got {pool_size!r}")
    return pool_size


class SamplerWorkspace:
    """Static scratch of the sampler: per (row, vocabulary chunk) results, per row state and
    candidate pool, arrival counters and statistics, in one int32 buffer.

    Allocate one before graph capture, at the largest `max_num_reqs` any launch will use, and
    keep it alive as long as the graphs: a captured step must be given one (`sample` allocates
    a fresh one per call otherwise, which is for eager use only). Launches leave the counters at
    zero; everything else is written before it is read."""

    def __init__(self, buffer: torch.Tensor, max_num_reqs: int, max_num_logits_per_req: int,
                 vocab_size: int, chunk_size: int, pool_size: int):
        self.chunk_size = _chunk_size(vocab_size, chunk_size)
        self.num_splits = -(-vocab_size // self.chunk_size)
        self.pool_size = _pool_size(self.num_splits, pool_size)
        self.max_num_reqs, self.max_num_logits_per_req = max_num_reqs, max_num_logits_per_req
        self.vocab_size = vocab_size
        sizes = _sections(max_num_reqs * max_num_logits_per_req, self.num_splits, self.pool_size)
        if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.int32:
            raise TypeError("buffer must be an int32 tensor")
        if buffer.dim() != 1 or buffer.shape[0] != sum(sizes.values()) or not buffer.is_contiguous():
            raise ValueError(f"buffer must be a contiguous [{sum(sizes.values())}] tensor, got "
                             f"shape {tuple(buffer.shape)}")
        self.buffer = buffer  # the kernels' one pointer; the views below are its sections
        self.partials, self.state, self.counters, self.pool, self.stats = \
            torch.split(buffer, list(sizes.values()))

    @classmethod
    def allocate(cls, max_num_reqs: int, max_num_logits_per_req: int, vocab_size: int,
                 device: torch.device | str, *, chunk_size: int | None = None,
                 pool_size: int | None = None) -> SamplerWorkspace:
        """A workspace for launches with `max_num_reqs <=` this bound, the layout's M and this
        vocabulary. `chunk_size` (power of two >= 16) overrides the vocabulary chunk per program,
        `pool_size` (power of two >= 16) the candidates kept per row."""
        for name, v, low in (("max_num_reqs", max_num_reqs, 0),
                             ("max_num_logits_per_req", max_num_logits_per_req, 1),
                             ("vocab_size", vocab_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        chunk = _chunk_size(vocab_size, chunk_size)
        splits = -(-vocab_size // chunk)
        pool = _pool_size(splits, pool_size)
        size = sum(_sections(max_num_reqs * max_num_logits_per_req, splits, pool).values())
        # Zeros: the arrival counters and pool fills must start at 0.
        buffer = torch.zeros(size, dtype=torch.int32, device=device)
        return cls(buffer, max_num_reqs, max_num_logits_per_req, vocab_size, chunk, pool)

    def paths(self) -> dict[str, int]:
        """How many rows took the slower paths since allocation: `draw_fallback` (whole-row
        filtered draw), `logprobs_fallback` (whole-row logprobs), `verified` (the unfiltered
        winner checked by counting). Every other row was settled from its candidates in the
        first launch. Reads the device: for tests and benchmarks, not for a decode loop."""
        stats = self.stats.tolist()
        return {"draw_fallback": stats[0], "logprobs_fallback": stats[1], "verified": stats[2]}


def _check_tables(tables: SlotTables, device: torch.device) -> None:
    if not isinstance(tables, SlotTables):
        raise TypeError(f"tables must be a SlotTables, got {type(tables).__name__}")
    if tables.packed.device != device:
        raise ValueError(f"tables are on {tables.packed.device}, logits on {device}")
    if not tables.packed.is_contiguous():
        raise ValueError("tables.packed must be contiguous")


def _check_workspace(workspace: SamplerWorkspace, vocab_size: int, layout: RecordLayout,
                     max_num_reqs: int, device: torch.device) -> None:
    if not isinstance(workspace, SamplerWorkspace):
        raise TypeError(f"workspace must be a SamplerWorkspace, got {type(workspace).__name__}")
    if workspace.buffer.device != device:
        raise ValueError(f"workspace is on {workspace.buffer.device}, logits on {device}")
    if workspace.vocab_size != vocab_size:
        raise ValueError(f"workspace was allocated for vocab_size {workspace.vocab_size}, "
                         f"got {vocab_size}")
    if workspace.max_num_logits_per_req != layout.max_num_logits_per_req:
        raise ValueError(f"workspace was allocated for {workspace.max_num_logits_per_req} logits "
                         f"rows per request, the layout has {layout.max_num_logits_per_req}")
    if workspace.max_num_reqs < max_num_reqs:
        raise ValueError(f"workspace holds {workspace.max_num_reqs} requests, "
                         f"max_num_reqs is {max_num_reqs}")


def _check_bitmask(bitmask, bitmask_rows, bitmask_enabled, vocab_size, num_rows, device) -> None:
    if (bitmask is None) != (bitmask_rows is None):
        raise ValueError("bitmask and bitmask_rows go together: pass both or neither")
    if bitmask is not None:
        words = -(-vocab_size // 32)
        if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
            raise TypeError(f"bitmask must be an int32 tensor, got "
                            f"{getattr(bitmask, 'dtype', type(bitmask).__name__)}")
        if bitmask.device != device:
            raise ValueError(f"bitmask is on {bitmask.device}, logits on {device}")
        if bitmask.dim() != 2 or bitmask.shape[1] < words or bitmask.stride(1) != 1:
            raise ValueError(f"bitmask must be [rows, >= {words}] with a contiguous last dim, "
                             f"got shape {tuple(bitmask.shape)} strides {bitmask.stride()}")
        check_int32_vector("bitmask_rows", bitmask_rows, num_rows, device, where="logits")
    if bitmask_enabled is not None:
        if bitmask is None:
            raise ValueError("bitmask_enabled needs a bitmask")
        check_int32_vector("bitmask_enabled", bitmask_enabled, 1, device, where="logits")


def _check_records(records, layout: RecordLayout, max_num_reqs: int, device) -> None:
    if not isinstance(records, torch.Tensor) or records.dtype != torch.int32:
        raise TypeError(f"records must be an int32 tensor, got "
                        f"{getattr(records, 'dtype', type(records).__name__)}")
    if records.device != device:
        raise ValueError(f"records is on {records.device}, logits on {device}")
    if records.dim() != 2 or records.shape[1] != layout.width or records.shape[0] < max_num_reqs \
            or records.stride(1) != 1:
        raise ValueError(f"records must be [>= {max_num_reqs}, {layout.width}] with a contiguous "
                         f"last dim, got shape {tuple(records.shape)} strides {records.stride()}")


def _block_size(vocab_size: int, k_p: int, block_size: int | None) -> int:
    if block_size is None:
        block_size = min(MAX_BLOCK_SIZE, triton.next_power_of_2(vocab_size))
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    # The running top-K merge takes a tile's top K_P, so a tile holds at least K_P tokens.
    return max(block_size, k_p, 16)


def sample(logits: torch.Tensor, *, vocab_size: int, num_reqs: torch.Tensor,
           req_slots: torch.Tensor, cu_num_logits: torch.Tensor, seq_lens: torch.Tensor,
           tables: SlotTables, layout: RecordLayout, records: torch.Tensor, max_num_reqs: int,
           draft_tokens: torch.Tensor | None = None, bitmask: torch.Tensor | None = None,
           bitmask_rows: torch.Tensor | None = None, bitmask_enabled: torch.Tensor | None = None,
           workspace: SamplerWorkspace | None = None, block_size: int | None = None) -> None:
    """Sample every request of a sub-batch into `records` [>= max_num_reqs, layout.width].

    `num_reqs` [1] int32 holds n on the device; `max_num_reqs` is the static grid bound. With a
    preallocated `workspace` (`SamplerWorkspace.allocate`) it never syncs with the host and
    allocates nothing, so it can run inside a captured graph; without one it allocates a
    workspace per call (eager use only). `block_size` (power of two) overrides the vocab tile."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits must be float32, bfloat16 or float16, got {logits.dtype}")
    if logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"logits must be 2-D [rows, padded_vocab] with a contiguous last dim, "
                         f"got shape {tuple(logits.shape)} strides {logits.stride()}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
            or not (1 <= vocab_size <= logits.shape[1]):
        raise ValueError(f"vocab_size must be an int in [1, {logits.shape[1]}], got {vocab_size!r}")
    if isinstance(max_num_reqs, bool) or not isinstance(max_num_reqs, int) or max_num_reqs < 0:
        raise ValueError(f"max_num_reqs must be an int >= 0, got {max_num_reqs!r}")
    if not isinstance(layout, RecordLayout):
        raise TypeError(f"layout must be a RecordLayout, got {type(layout).__name__}")
    device = logits.device
    num_rows = logits.shape[0]
    check_int32_vector("num_reqs", num_reqs, 1, device, where="logits")
    check_int32_vector("req_slots", req_slots, max_num_reqs, device, where="logits")
    check_int32_vector("cu_num_logits", cu_num_logits, max_num_reqs + 1, device, where="logits")
    check_int32_vector("seq_lens", seq_lens, max_num_reqs, device, where="logits")
    _check_tables(tables, device)
    _check_records(records, layout, max_num_reqs, device)
    if draft_tokens is not None:
        check_int32_vector("draft_tokens", draft_tokens, num_rows, device, where="logits")
    _check_bitmask(bitmask, bitmask_rows, bitmask_enabled, vocab_size, num_rows, device)
    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    # tl.topk needs at least 2 entries.
    k_p = max(triton.next_power_of_2(k), 2)
    if k_p > SMALL_BLOCK_SIZE:
        raise ValueError(f"layout.num_logprobs must be <= {SMALL_BLOCK_SIZE}, got {k}")
    block = _block_size(vocab_size, k_p, block_size)
    if workspace is None:
        workspace = SamplerWorkspace.allocate(max_num_reqs, m, vocab_size, device)
    _check_workspace(workspace, vocab_size, layout, max_num_reqs, device)
    if max_num_reqs == 0:
        return

    chunk, splits, cap = workspace.chunk_size, workspace.num_splits, workspace.pool_size
    rows = workspace.max_num_reqs * m
    # Both powers of two: the split passes' tile divides its chunk.
    chunk_block = min(block, chunk)
    lanes = min(FLOOR_LANES, chunk_block)
    dummy = cu_num_logits  # stands in for absent optional pointers; never read
    common = (logits, logits.stride(0), num_reqs, req_slots, cu_num_logits, seq_lens,
              bitmask if bitmask is not None else dummy,
              bitmask.stride(0) if bitmask is not None else 0,
              bitmask_rows if bitmask_rows is not None else dummy,
              bitmask_enabled if bitmask_enabled is not None else dummy,
              tables.packed, workspace.buffer, records, records.stride(0))
    flags = dict(HAS_BITMASK=bitmask is not None, HAS_BITMASK_FLAG=bitmask_enabled is not None)
    split_grid = (max_num_reqs * m, splits)
    splits_p = max(triton.next_power_of_2(splits), 2)
    warps = 8 if chunk_block >= 2048 else 4
    launch(_scan_kernel, split_grid, *common,
           VOCAB=vocab_size, M=m, K=k, K_P=k_p, CHUNK=chunk, SPLITS=splits, SPLITS_P=splits_p,
           ROWS=rows, CAP=cap, TILE=max(min(POOL_TILE, cap), k_p), LANES=lanes,
           TOP=min(CHUNK_TOP, lanes), BLOCK=chunk_block, RADIX_BITS=RADIX_BITS, **flags,
           num_warps=warps)
    launch(_verify_kernel, split_grid, *common,
           VOCAB=vocab_size, M=m, K=k, CHUNK=chunk, SPLITS=splits, SPLITS_P=splits_p, ROWS=rows,
           CAP=cap, BLOCK=chunk_block, **flags, num_warps=warps)
    launch(_finish_kernel, (max_num_reqs,), *common,
           draft_tokens if draft_tokens is not None else dummy,
           VOCAB=vocab_size, M=m, M_P=triton.next_power_of_2(m), K=k, K_P=k_p, SPLITS=splits,
           ROWS=rows, CAP=cap, HAS_DRAFTS=draft_tokens is not None, **flags,
           BLOCK=block, SMALL_BLOCK=min(block, SMALL_BLOCK_SIZE), RADIX_BITS=RADIX_BITS,
           num_warps=8 if block >= 2048 else 4)
