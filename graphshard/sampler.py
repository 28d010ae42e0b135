"""Graph-safe sampling of a sub-batch of requests: one Triton program per request.

Contract
--------
Request `j` owns logits rows `cu_num_logits[j] .. cu_num_logits[j+1]-1` (`m_j` rows, at most the
layout's M; extra rows are ignored). The request count `n` is read from device memory; the grid
is the static bound `max_num_reqs` and programs `j >= n` exit at once, so one compiled kernel
serves every batch size and padded requests cost nothing. Records past `n` are not touched.

Per row, with the slot's parameters (`graphshard.params.SlotTables`):
- Only columns `< vocab_size` exist: padding columns are never read, sampled or reported.
- Logits are read as fp32/bf16/fp16 and computed in fp32. NaN counts as -inf; `num_nans` is the
  number of the request's rows with at least one NaN in the real vocabulary.
- The grammar bitmask (bit `t % 32` of word `t // 32` of row `bitmask_rows[row]`) sets
  disallowed tokens to -inf.
- temperature 0: greedy, the argmax of the masked logits, lowest token id on ties; filters are
  ignored.
- temperature > 0: scores `s = logit / temperature`, then in order top-k (keep `s >=` the k-th
  largest `s`; off when `top_k <= 0` or `>= vocab_size`), top-p (keep the smallest set of most
  probable tokens, probabilities normalised over the top-k survivors, whose mass reaches `top_p`;
  ties at the threshold are kept; off when `top_p >= 1`), min-p (keep `p >= min_p * p_max`; off
  when `min_p <= 0`). Thresholds come from a digit-by-digit search over the order-preserving
  uint32 image of the fp32 score (no sort; 8 passes of 16 candidate digits), run only when the
  filter is on. The token is the Gumbel-max `argmax_t s_t + g(seed, position, t)` over the kept
  tokens (`graphshard.rng`: keyed by seed, position and token id only), the position of row `k`
  being `seq_lens[j] + k`.
- A row with no finite score samples token 0.

Speculative decoding: every row is sampled; drafts (`draft_tokens[row]`, ignored on a request's
last row) are accepted along the longest prefix of rows `0..m-2` whose sample equals the draft.
`num_sampled = accepted + 1` (the last token is the correction or bonus token), `num_rejected =
m - 1 - accepted`, tokens past `num_sampled` are -1. Without drafts nothing is accepted:
`num_sampled = 1`, the sample of row 0. Rows after the first rejection are only scanned for NaNs.

Logprobs (layout K > 0 and the slot's `num_logprobs > 0`), from the raw logits (fp32
log-softmax over the real vocabulary, before bitmask, temperature and filters), for the rows
`r < num_sampled`: top-K ids and logprobs (descending, ties by lower id), the sampled token's
logprob and rank (1 + number of tokens with a strictly larger raw logit). Entries past the
slot's `num_logprobs`, rows `r >= num_sampled` and slots without logprobs hold id -1, logprob
-inf, sampled logprob -inf and rank 0.

Results land in one packed int32 record per request (`graphshard.records`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphshard import rng
from graphshard.launch import check_int32_vector, launch
from graphshard.params import SlotTables
from graphshard.records import RecordLayout

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK_SIZE = 2048
# Tile of the multi-pass paths (threshold search, logprobs): their wider per-token state would
# cost registers that the one-pass greedy path needs for occupancy.
SMALL_BLOCK_SIZE = 512
# Bits of the threshold decided per pass of the threshold search: 16 candidates, 8 passes.
RADIX_BITS = 4


@triton.jit
def _order_key(x):
    """fp32 -> uint32 with the same order, so a float threshold can be searched bit by bit."""
    b = x.to(tl.uint32, bitcast=True)
    return tl.where((b >> 31) != 0, b ^ 0xFFFFFFFF, b | 0x80000000)


@triton.jit
def _key_to_float(k):
    b = tl.where((k >> 31) != 0, k ^ 0x80000000, k ^ 0xFFFFFFFF)
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """One vocab tile of a row: (fp32 logits with NaN/padding/disallowed = -inf, NaN flags)."""
    valid = offs < VOCAB
    x = tl.load(row_ptr + offs, mask=valid, other=float("-inf")).to(tl.float32)
    is_nan = x != x
    x = tl.where(is_nan, float("-inf"), x)
    if HAS_BITMASK:
        # A step without a bitmask masks the load off: no bytes read, every token allowed.
        words = tl.load(mask_row_ptr + offs // 32, mask=valid & mask_on, other=-1)
        allowed = ((words >> (offs % 32)) & 1) != 0
        x = tl.where(allowed, x, float("-inf"))
    return x, is_nan


@triton.jit
def _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, key, thr_key, min_score,
              DRAW: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr):
    """One pass over a row -> (has NaN, max masked logit, its lowest id, drawn token).

    With DRAW, also the Gumbel-max token over the scores kept by the thresholds (key of the
    score >= thr_key and score >= min_score). Per-lane running results keep reductions out of
    the loop; a lane only ever sees increasing ids, so strict `>` keeps the lowest id."""
    lanes = tl.arange(0, BLOCK)
    any_nan = tl.zeros([BLOCK], tl.int1)
    best_x = tl.full([BLOCK], float("-inf"), tl.float32)
    best_xi = tl.zeros([BLOCK], tl.int32)
    best_z = tl.full([BLOCK], float("-inf"), tl.float32)
    best_zi = tl.zeros([BLOCK], tl.int32)
    for start in range(0, VOCAB, BLOCK):
        offs = start + lanes
        x, is_nan = _load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK)
        any_nan = any_nan | is_nan
        better = x > best_x
        best_xi = tl.where(better, offs, best_xi)
        best_x = tl.where(better, x, best_x)
        if DRAW:
            s = x * inv_temp
            kept = (_order_key(s) >= thr_key) & (s >= min_score)
            z = tl.where(kept, s + rng.gumbel(key, offs), float("-inf"))
            better = z > best_z
            best_zi = tl.where(better, offs, best_zi)
            best_z = tl.where(better, z, best_z)
    has_nan = tl.max(any_nan.to(tl.int32), axis=0)
    max_x = tl.max(best_x, axis=0)
    # A lane that never beat -inf still holds id 0: a row without finite scores yields token 0.
    arg_x = tl.min(tl.where(best_x == max_x, best_xi, 2147483647), axis=0)
    max_z = tl.max(best_z, axis=0)
    arg_z = tl.min(tl.where(best_z == max_z, best_zi, 2147483647), axis=0)
    return has_nan, max_x, arg_x, arg_z


@triton.jit
def _search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, inv_temp, max_score, floor_key,
                      goal, BY_MASS: tl.constexpr, BLOCK: tl.constexpr,
                      HAS_BITMASK: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Largest uint32 key T with W(key(s) >= T) >= target, decided RADIX_BITS bits per pass.

    W counts tokens (top-k: target = goal = k), or sums exp(s - max_score) over tokens whose
    key >= floor_key (top-p: target = goal * total mass). W is non-increasing in T, so the
    number of candidate digits meeting the target picks the next digit; the result is exactly
    the k-th largest key, or the smallest kept probability of top-p."""
    RADIX: tl.constexpr = 1 << RADIX_BITS
    lanes = tl.arange(0, BLOCK)
    digits = tl.arange(0, RADIX).to(tl.uint32)
    prefix = tl.full((), 0, tl.uint32)
    target = goal
    for p in tl.static_range(32 // RADIX_BITS):
        shift = 32 - RADIX_BITS * (p + 1)
        cand = prefix | (digits << shift)  # [RADIX]
        acc = tl.zeros([RADIX], tl.float32)
        for start in range(0, VOCAB, BLOCK):
            offs = start + lanes
            x, _ = _load_masked(row_ptr, mask_row_ptr, mask_on, offs, VOCAB, HAS_BITMASK)
            s = x * inv_temp
            k = _order_key(s)
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
def _sample_row(row_ptr, mask_row_ptr, mask_on, VOCAB: tl.constexpr, key, temperature, top_k, top_p,
                min_p, BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr,
                RADIX_BITS: tl.constexpr):
    """-> (token, has NaN) of one active row; greedy and unfiltered rows take one pass."""
    is_random = temperature > 0.0
    inv_temp = 1.0 / tl.where(is_random, temperature, 1.0)
    use_top_k = (top_k > 0) & (top_k < VOCAB)
    use_top_p = top_p < 1.0
    use_min_p = min_p > 0.0
    no_key = tl.full((), 0, tl.uint32)
    if is_random & (use_top_k | use_top_p | use_min_p):
        has_nan, max_x, _, _ = _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, key, no_key,
                                         float("-inf"), False, BLOCK, HAS_BITMASK)
        max_score = max_x * inv_temp
        # Without a finite score the row samples token 0 anyway; skip the searches.
        finite = max_score > float("-inf")
        thr = no_key
        if use_top_k & finite:
            thr = _search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, max_score, no_key,
                                    top_k.to(tl.float32), False, SMALL_BLOCK, HAS_BITMASK,
                                    RADIX_BITS)
        if use_top_p & finite:
            thr = _search_threshold(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, max_score, thr,
                                    top_p, True, SMALL_BLOCK, HAS_BITMASK, RADIX_BITS)
        # p / p_max = exp(s - s_max), whatever the normalisation.
        min_score = tl.where(use_min_p, max_score + tl.log(tl.where(use_min_p, min_p, 1.0)),
                             float("-inf"))
        _, _, _, token = _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, key, thr, min_score,
                                   True, BLOCK, HAS_BITMASK)
    elif is_random:
        has_nan, _, _, token = _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, key, no_key,
                                         float("-inf"), True, BLOCK, HAS_BITMASK)
    else:
        has_nan, _, token, _ = _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB, inv_temp, key, no_key,
                                         float("-inf"), False, BLOCK, HAS_BITMASK)
    return token, has_nan


@triton.jit
def _logprob_row(row_ptr, VOCAB: tl.constexpr, token, BLOCK: tl.constexpr, K_P: tl.constexpr):
    """Raw log-softmax facts of one row -> (top-K_P ids [K_P], their logprobs, the token's
    logprob, its rank). The running top-K_P is a sorted list of 64-bit keys (value key, then
    inverted id, so ties rank lower ids first) merged with a tile only when the tile beats it."""
    lanes = tl.arange(0, BLOCK)
    tok_x = tl.load(row_ptr + token).to(tl.float32)
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
        rank_key = (_order_key(x).to(tl.uint64) << 32) | inverted_id.to(tl.uint64)
        rank_key = tl.where(valid, rank_key, 0)
        if tl.max(rank_key, axis=0) > floor:
            top = tl.topk(rank_key, K_P)
            # Descending vs ascending, element-wise max: the K_P largest of both (bitonic).
            best = tl.sort(tl.maximum(best, tl.flip(top, 0)), descending=True)
            floor = tl.min(best, axis=0)
    row_max = tl.max(run_max, axis=0)
    lane_sum = tl.where(run_max == float("-inf"), 0.0, run_sum * tl.exp(run_max - row_max))
    total = tl.sum(lane_sum, axis=0)
    lse = tl.where(row_max == float("-inf"), 0.0, row_max + tl.log(total))
    empty = best == 0
    ids = ((best & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32, bitcast=True)
    ids = tl.where(empty, -1, ids)
    vals = tl.where(empty, float("-inf"), _key_to_float((best >> 32).to(tl.uint32)) - lse)
    rank = 1 + tl.sum(above, axis=0)
    return ids, vals, tok_x - lse, rank


# logits_stride stays specialised: the engine's logits buffer fixes it, and a stride divisible
# by 16 lets the row loads vectorise. Nothing that varies per step is an int argument.
@triton.jit(do_not_specialize=["records_stride", "bitmask_stride"])
def _sample_kernel(
    logits_ptr,  # [num_rows, padded_vocab] fp32/bf16/fp16
    logits_stride,
    num_reqs_ptr,  # [1] int32: n
    req_slots_ptr,  # [>= n] int32
    cu_num_logits_ptr,  # [>= n + 1] int32
    seq_lens_ptr,  # [>= n] int32
    draft_ptr,  # [num_rows] int32 (HAS_DRAFTS)
    bitmask_ptr,  # [num_bitmask_rows, ceil(vocab / 32)] int32 (HAS_BITMASK)
    bitmask_stride,
    bitmask_rows_ptr,  # [num_rows] int32 (HAS_BITMASK)
    bitmask_on_ptr,  # [1] int32: 0 = this step has no bitmask (HAS_BITMASK_FLAG)
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr,  # [max_num_slots] each
    seed_lo_ptr, seed_hi_ptr, num_logprobs_ptr,
    records_ptr,  # [>= n, width] int32
    records_stride,
    VOCAB: tl.constexpr, M: tl.constexpr, M_P: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
    HAS_DRAFTS: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr,
    BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    req = tl.program_id(0)
    if req >= tl.load(num_reqs_ptr):
        return
    slot = tl.load(req_slots_ptr + req)
    first_row = tl.load(cu_num_logits_ptr + req)
    m = tl.minimum(tl.load(cu_num_logits_ptr + req + 1) - first_row, M)
    seq_len = tl.load(seq_lens_ptr + req)
    temperature = tl.load(temperature_ptr + slot)
    top_k = tl.load(top_k_ptr + slot)
    top_p = tl.load(top_p_ptr + slot)
    min_p = tl.load(min_p_ptr + slot)
    seed_lo = tl.load(seed_lo_ptr + slot)
    seed_hi = tl.load(seed_hi_ptr + slot)

    mask_on = True
    if HAS_BITMASK_FLAG:
        mask_on = tl.load(bitmask_on_ptr) != 0
    row_ids = tl.arange(0, M_P)
    samples = tl.full([M_P], -1, tl.int32)
    accepted = m - 1
    stopped = 0
    num_nans = 0
    no_key = tl.full((), 0, tl.uint32)
    # A static trip count (M is small): the Triton interpreter cannot loop to a loaded bound.
    for r in range(0, M):
        if r < m:
            row = first_row + r
            row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
            mask_row_ptr = bitmask_ptr
            if HAS_BITMASK:
                mask_row = tl.load(bitmask_rows_ptr + row).to(tl.int64)
                mask_row_ptr = bitmask_ptr + mask_row * bitmask_stride
            if stopped == 0:
                key = rng.row_key(seed_lo, seed_hi, seq_len + r)
                token, has_nan = _sample_row(row_ptr, mask_row_ptr, mask_on, VOCAB, key, temperature,
                                             top_k, top_p, min_p, BLOCK, SMALL_BLOCK, HAS_BITMASK,
                                             RADIX_BITS)
            else:
                # Past the first rejection only the NaN count is still owed.
                has_nan, _, token, _ = _scan_row(row_ptr, mask_row_ptr, mask_on, VOCAB, 1.0, no_key, no_key,
                                                 float("-inf"), False, BLOCK, HAS_BITMASK)
            num_nans += has_nan
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
        num_logprobs = tl.minimum(tl.load(num_logprobs_ptr + slot), K)
        ranks_at = tl.arange(0, K_P)
        for r in range(0, M):
            ids = tl.full([K_P], -1, tl.int32)
            vals = tl.full([K_P], float("-inf"), tl.float32)
            token_logprob = float("-inf")
            rank = 0
            if (r <= accepted) & (num_logprobs > 0):
                row_ptr = logits_ptr + (first_row + r).to(tl.int64) * logits_stride
                token = tl.sum(tl.where(row_ids == r, samples, 0), axis=0)
                ids, vals, token_logprob, rank = _logprob_row(row_ptr, VOCAB, token, SMALL_BLOCK,
                                                              K_P)
                ids = tl.where(ranks_at < num_logprobs, ids, -1)
                vals = tl.where(ranks_at < num_logprobs, vals, float("-inf"))
            out = rec_ptr + M + 3 + r * K + ranks_at
            tl.store(out, ids, mask=ranks_at < K)
            tl.store(out + M * K, vals.to(tl.int32, bitcast=True), mask=ranks_at < K)
            tl.store(rec_ptr + M + 3 + 2 * M * K + r, token_logprob.to(tl.int32, bitcast=True))
            tl.store(rec_ptr + M + 3 + 2 * M * K + M + r, rank)


def _check_tables(tables: SlotTables, device: torch.device) -> None:
    if not isinstance(tables, SlotTables):
        raise TypeError(f"tables must be a SlotTables, got {type(tables).__name__}")
    for name in ("temperature", "top_k", "top_p", "min_p", "seed_lo", "seed_hi", "num_logprobs"):
        t = getattr(tables, name)
        if t.device != device:
            raise ValueError(f"tables.{name} is on {t.device}, logits on {device}")
        if not t.is_contiguous():
            raise ValueError(f"tables.{name} must be contiguous")


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
           block_size: int | None = None) -> None:
    """Sample every request of a sub-batch into `records` [>= max_num_reqs, layout.width].

    `num_reqs` [1] int32 holds n on the device; `max_num_reqs` is the static grid. Never syncs
    with the host and allocates nothing, so it can run inside a captured graph. `block_size`
    (power of two) overrides the vocab tile."""
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
    if not isinstance(records, torch.Tensor) or records.dtype != torch.int32:
        raise TypeError(f"records must be an int32 tensor, got "
                        f"{getattr(records, 'dtype', type(records).__name__)}")
    if records.device != device:
        raise ValueError(f"records is on {records.device}, logits on {device}")
    if records.dim() != 2 or records.shape[1] != layout.width or records.shape[0] < max_num_reqs \
            or records.stride(1) != 1:
        raise ValueError(f"records must be [>= {max_num_reqs}, {layout.width}] with a contiguous "
                         f"last dim, got shape {tuple(records.shape)} strides {records.stride()}")
    if draft_tokens is not None:
        check_int32_vector("draft_tokens", draft_tokens, num_rows, device, where="logits")
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
    if max_num_reqs == 0:
        return

    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    # tl.topk needs at least 2 entries.
    k_p = max(triton.next_power_of_2(k), 2)
    if k_p > SMALL_BLOCK_SIZE:
        raise ValueError(f"layout.num_logprobs must be <= {SMALL_BLOCK_SIZE}, got {k}")
    block = _block_size(vocab_size, k_p, block_size)
    dummy = cu_num_logits  # stands in for absent optional pointers; never read
    launch(
        _sample_kernel, (max_num_reqs,),
        logits, logits.stride(0), num_reqs, req_slots, cu_num_logits, seq_lens,
        draft_tokens if draft_tokens is not None else dummy,
        bitmask if bitmask is not None else dummy,
        bitmask.stride(0) if bitmask is not None else 0,
        bitmask_rows if bitmask_rows is not None else dummy,
        bitmask_enabled if bitmask_enabled is not None else dummy,
        tables.temperature, tables.top_k, tables.top_p, tables.min_p,
        tables.seed_lo, tables.seed_hi, tables.num_logprobs,
        records, records.stride(0),
        VOCAB=vocab_size, M=m, M_P=triton.next_power_of_2(m), K=k, K_P=k_p,
        HAS_DRAFTS=draft_tokens is not None, HAS_BITMASK=bitmask is not None,
        HAS_BITMASK_FLAG=bitmask_enabled is not None,
        BLOCK=block, SMALL_BLOCK=min(block, SMALL_BLOCK_SIZE), RADIX_BITS=RADIX_BITS,
        num_warps=8 if block >= 2048 else 4,
    )
