"""Graph-safe sampling of a sub-batch of requests: a split-vocabulary pass, then one program
per request.

Contract
--------
Request `j` owns logits rows `cu_num_logits[j] .. cu_num_logits[j+1]-1` (`m_j` rows, at most the
layout's M; extra rows are ignored). The request count `n` is read from device memory; the grids
are static bounds (`max_num_reqs`) and programs of requests `j >= n` exit at once, so one
compiled pair of kernels serves every batch size and padded requests cost nothing. Records past
`n` are not touched.

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

Execution
---------
A request's rows would take one SM through the whole vocabulary, so the one-pass work is split:
1. `_sample_partials_kernel`, grid `(max_num_reqs, SPLITS)`: program (j, c) scans vocabulary
   chunk c (`CHUNK` columns) of each of the request's rows once and writes, per row, the NaN
   flag, the max masked logit with its lowest id and, for random rows without filters, the
   Gumbel-max score with its lowest id into a `SamplerWorkspace`.
2. `_sample_kernel`, grid `(max_num_reqs,)`: combines the chunks (max, then lowest id: exactly
   the one-pass result, ties and "no finite score -> token 0" included), runs the whole-row
   passes only for rows that need them (filtered random draws, logprobs), verifies drafts and
   writes the record.
Greedy and unfiltered random rows are read once in total; CHUNK and SPLITS depend only on the
vocabulary, not on the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphshard import rng
from graphshard.launch import check_int32_vector, launch
from graphshard.params import SlotTables
from graphshard.records import RecordLayout
from graphshard.sampler_rows import draw_filtered, logprob_row, scan_chunk, uses_filters

LOGITS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_BLOCK_SIZE = 2048
# Tile of the multi-pass paths (threshold search, logprobs): their wider per-token state would
# cost registers that the one-pass greedy path needs for occupancy.
SMALL_BLOCK_SIZE = 512
# Bits of the threshold decided per pass of the threshold search: 16 candidates, 8 passes.
RADIX_BITS = 4
# Vocabulary columns per program of the split pass: a 152K vocabulary spreads over 19 SMs.
CHUNK_SIZE = 8192

# Partial results per (request, row, split), int32 (floats as bits): [max_num_reqs, M, 5, SPLITS].
NUM_FIELDS = tl.constexpr(5)
NAN_FIELD = tl.constexpr(0)  # 1 if the chunk holds a NaN
MAX_X_FIELD = tl.constexpr(1)  # max masked logit (fp32 bits)
ARG_X_FIELD = tl.constexpr(2)  # its lowest id
MAX_Z_FIELD = tl.constexpr(3)  # max Gumbel score s + g (fp32 bits), random rows without filters
ARG_Z_FIELD = tl.constexpr(4)  # its lowest id


@triton.jit
def _combine_max(part_ptr, VAL_FIELD: tl.constexpr, ARG_FIELD: tl.constexpr, SPLITS: tl.constexpr,
                 SPLITS_P: tl.constexpr):
    """(max, lowest id at it) of a row from its chunks' (max, lowest id at the chunk max) pairs."""
    splits = tl.arange(0, SPLITS_P)
    live = splits < SPLITS
    vals = tl.load(part_ptr + VAL_FIELD * SPLITS + splits, mask=live, other=0)
    vals = tl.where(live, vals.to(tl.float32, bitcast=True), float("-inf"))
    ids = tl.load(part_ptr + ARG_FIELD * SPLITS + splits, mask=live, other=2147483647)
    best = tl.max(vals, axis=0)
    return best, tl.min(tl.where(vals == best, ids, 2147483647), axis=0)


# logits_stride stays specialised: the engine's logits buffer fixes it, and a stride divisible
# by 16 lets the row loads vectorise. Nothing that varies per step is an int argument.
@triton.jit(do_not_specialize=["bitmask_stride"])
def _sample_partials_kernel(
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
    temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_lo_ptr, seed_hi_ptr,  # [max_num_slots]
    partials_ptr,  # [>= n, M, NUM_FIELDS, SPLITS] int32
    VOCAB: tl.constexpr, M: tl.constexpr, CHUNK: tl.constexpr, SPLITS: tl.constexpr,
    HAS_BITMASK: tl.constexpr, HAS_BITMASK_FLAG: tl.constexpr, BLOCK: tl.constexpr,
):
    req = tl.program_id(0)
    if req >= tl.load(num_reqs_ptr):
        return
    split = tl.program_id(1)
    slot = tl.load(req_slots_ptr + req)
    first_row = tl.load(cu_num_logits_ptr + req)
    m = tl.minimum(tl.load(cu_num_logits_ptr + req + 1) - first_row, M)
    seq_len = tl.load(seq_lens_ptr + req)
    temperature = tl.load(temperature_ptr + slot)
    filtered = uses_filters(tl.load(top_k_ptr + slot), tl.load(top_p_ptr + slot),
                            tl.load(min_p_ptr + slot), VOCAB)
    seed_lo = tl.load(seed_lo_ptr + slot)
    seed_hi = tl.load(seed_hi_ptr + slot)
    is_random = temperature > 0.0
    inv_temp = 1.0 / tl.where(is_random, temperature, 1.0)
    # Filtered rows draw in the per-request pass, once their thresholds are known.
    draw = is_random & ~filtered

    mask_on = True
    if HAS_BITMASK_FLAG:
        mask_on = tl.load(bitmask_on_ptr) != 0
    lo = split * CHUNK
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
            key = rng.row_key(seed_lo, seed_hi, seq_len + r)
            if draw:
                has_nan, max_x, arg_x, max_z, arg_z = scan_chunk(
                    row_ptr, mask_row_ptr, mask_on, lo, CHUNK, VOCAB, inv_temp, key, no_key,
                    float("-inf"), True, BLOCK, HAS_BITMASK)
            else:
                has_nan, max_x, arg_x, max_z, arg_z = scan_chunk(
                    row_ptr, mask_row_ptr, mask_on, lo, CHUNK, VOCAB, inv_temp, key, no_key,
                    float("-inf"), False, BLOCK, HAS_BITMASK)
            out = partials_ptr + (req * M + r).to(tl.int64) * (NUM_FIELDS * SPLITS) + split
            tl.store(out + NAN_FIELD * SPLITS, has_nan)
            tl.store(out + MAX_X_FIELD * SPLITS, max_x.to(tl.int32, bitcast=True))
            tl.store(out + ARG_X_FIELD * SPLITS, arg_x)
            tl.store(out + MAX_Z_FIELD * SPLITS, max_z.to(tl.int32, bitcast=True))
            tl.store(out + ARG_Z_FIELD * SPLITS, arg_z)


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
    partials_ptr,  # [>= n, M, NUM_FIELDS, SPLITS] int32, written by _sample_partials_kernel
    records_ptr,  # [>= n, width] int32
    records_stride,
    VOCAB: tl.constexpr, M: tl.constexpr, M_P: tl.constexpr, K: tl.constexpr, K_P: tl.constexpr,
    SPLITS: tl.constexpr, SPLITS_P: tl.constexpr,
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
    is_random = temperature > 0.0
    inv_temp = 1.0 / tl.where(is_random, temperature, 1.0)
    filtered = uses_filters(top_k, top_p, min_p, VOCAB)

    mask_on = True
    if HAS_BITMASK_FLAG:
        mask_on = tl.load(bitmask_on_ptr) != 0
    row_ids = tl.arange(0, M_P)
    splits = tl.arange(0, SPLITS_P)
    samples = tl.full([M_P], -1, tl.int32)
    accepted = m - 1
    stopped = 0
    num_nans = 0
    for r in range(0, M):
        if r < m:
            row = first_row + r
            part = partials_ptr + (req * M + r).to(tl.int64) * (NUM_FIELDS * SPLITS)
            nan_flags = tl.load(part + NAN_FIELD * SPLITS + splits, mask=splits < SPLITS, other=0)
            has_nan = tl.max(nan_flags, axis=0)
            max_x, token = _combine_max(part, MAX_X_FIELD, ARG_X_FIELD, SPLITS, SPLITS_P)
            # Past the first rejection only the NaN count is still owed.
            if stopped == 0:
                if is_random & filtered:
                    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
                    mask_row_ptr = bitmask_ptr
                    if HAS_BITMASK:
                        mask_row = tl.load(bitmask_rows_ptr + row).to(tl.int64)
                        mask_row_ptr = bitmask_ptr + mask_row * bitmask_stride
                    key = rng.row_key(seed_lo, seed_hi, seq_len + r)
                    token = draw_filtered(row_ptr, mask_row_ptr, mask_on, VOCAB, key, inv_temp, max_x,
                                          top_k, top_p, min_p, BLOCK, SMALL_BLOCK, HAS_BITMASK,
                                          RADIX_BITS)
                elif is_random:
                    _, token = _combine_max(part, MAX_Z_FIELD, ARG_Z_FIELD, SPLITS, SPLITS_P)
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
                ids, vals, token_logprob, rank = logprob_row(row_ptr, VOCAB, token, SMALL_BLOCK, K_P)
                ids = tl.where(ranks_at < num_logprobs, ids, -1)
                vals = tl.where(ranks_at < num_logprobs, vals, float("-inf"))
            out = rec_ptr + M + 3 + r * K + ranks_at
            tl.store(out, ids, mask=ranks_at < K)
            tl.store(out + M * K, vals.to(tl.int32, bitcast=True), mask=ranks_at < K)
            tl.store(rec_ptr + M + 3 + 2 * M * K + r, token_logprob.to(tl.int32, bitcast=True))
            tl.store(rec_ptr + M + 3 + 2 * M * K + M + r, rank)


def _chunk_size(vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return min(CHUNK_SIZE, max(16, triton.next_power_of_2(vocab_size)))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 16 \
            or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size!r}")
    return chunk_size


class SamplerWorkspace:
    """Static scratch of the split pass: per (request, row, vocabulary chunk) partial results.

    Allocate one before graph capture, at the largest `max_num_reqs` any launch will use, and
    keep it alive as long as the graphs: a captured step must be given one (`sample` allocates
    a fresh one per call otherwise, which is for eager use only). Contents between launches are
    meaningless; every launch writes what it reads."""

    def __init__(self, partials: torch.Tensor, vocab_size: int, chunk_size: int):
        chunk_size = _chunk_size(vocab_size, chunk_size)
        splits = -(-vocab_size // chunk_size)
        if not isinstance(partials, torch.Tensor) or partials.dtype != torch.int32:
            raise TypeError("partials must be an int32 tensor")
        if partials.dim() != 4 or tuple(partials.shape[2:]) != (NUM_FIELDS.value, splits) \
                or not partials.is_contiguous():
            raise ValueError(f"partials must be contiguous [reqs, M, {NUM_FIELDS.value}, {splits}], "
                             f"got shape {tuple(partials.shape)}")
        self.partials = partials  # [max_num_reqs, M, NUM_FIELDS, num_splits] int32
        self.vocab_size = vocab_size
        self.chunk_size = chunk_size

    @classmethod
    def allocate(cls, max_num_reqs: int, max_num_logits_per_req: int, vocab_size: int,
                 device: torch.device | str, *, chunk_size: int | None = None) -> SamplerWorkspace:
        """A workspace for launches with `max_num_reqs <=` this bound, the layout's M and this
        vocabulary. `chunk_size` (power of two >= 16) overrides the vocabulary chunk per program."""
        for name, v, low in (("max_num_reqs", max_num_reqs, 0),
                             ("max_num_logits_per_req", max_num_logits_per_req, 1),
                             ("vocab_size", vocab_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        chunk = _chunk_size(vocab_size, chunk_size)
        splits = -(-vocab_size // chunk)
        partials = torch.empty((max_num_reqs, max_num_logits_per_req, NUM_FIELDS.value, splits),
                               dtype=torch.int32, device=device)
        return cls(partials, vocab_size, chunk)

    @property
    def max_num_reqs(self) -> int:
        return self.partials.shape[0]

    @property
    def max_num_logits_per_req(self) -> int:
        return self.partials.shape[1]

    @property
    def num_splits(self) -> int:
        return self.partials.shape[3]


def _check_tables(tables: SlotTables, device: torch.device) -> None:
    if not isinstance(tables, SlotTables):
        raise TypeError(f"tables must be a SlotTables, got {type(tables).__name__}")
    for name in ("temperature", "top_k", "top_p", "min_p", "seed_lo", "seed_hi", "num_logprobs"):
        t = getattr(tables, name)
        if t.device != device:
            raise ValueError(f"tables.{name} is on {t.device}, logits on {device}")
        if not t.is_contiguous():
            raise ValueError(f"tables.{name} must be contiguous")


def _check_workspace(workspace: SamplerWorkspace, vocab_size: int, layout: RecordLayout,
                     max_num_reqs: int, device: torch.device) -> None:
    if not isinstance(workspace, SamplerWorkspace):
        raise TypeError(f"workspace must be a SamplerWorkspace, got {type(workspace).__name__}")
    if workspace.partials.device != device:
        raise ValueError(f"workspace is on {workspace.partials.device}, logits on {device}")
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

    chunk, splits = workspace.chunk_size, workspace.num_splits
    # Both powers of two: the split pass's tile divides its chunk.
    chunk_block = min(block, chunk)
    dummy = cu_num_logits  # stands in for absent optional pointers; never read
    bitmask_args = (bitmask if bitmask is not None else dummy,
                    bitmask.stride(0) if bitmask is not None else 0,
                    bitmask_rows if bitmask_rows is not None else dummy,
                    bitmask_enabled if bitmask_enabled is not None else dummy)
    flags = dict(HAS_BITMASK=bitmask is not None, HAS_BITMASK_FLAG=bitmask_enabled is not None)
    launch(
        _sample_partials_kernel, (max_num_reqs, splits),
        logits, logits.stride(0), num_reqs, req_slots, cu_num_logits, seq_lens, *bitmask_args,
        tables.temperature, tables.top_k, tables.top_p, tables.min_p, tables.seed_lo,
        tables.seed_hi, workspace.partials,
        VOCAB=vocab_size, M=m, CHUNK=chunk, SPLITS=splits, BLOCK=chunk_block, **flags,
        num_warps=8 if chunk_block >= 2048 else 4,
    )
    launch(
        _sample_kernel, (max_num_reqs,),
        logits, logits.stride(0), num_reqs, req_slots, cu_num_logits, seq_lens,
        draft_tokens if draft_tokens is not None else dummy, *bitmask_args,
        tables.temperature, tables.top_k, tables.top_p, tables.min_p,
        tables.seed_lo, tables.seed_hi, tables.num_logprobs, workspace.partials,
        records, records.stride(0),
        VOCAB=vocab_size, M=m, M_P=triton.next_power_of_2(m), K=k, K_P=k_p,
        SPLITS=splits, SPLITS_P=max(triton.next_power_of_2(splits), 2),
        HAS_DRAFTS=draft_tokens is not None, **flags,
        BLOCK=block, SMALL_BLOCK=min(block, SMALL_BLOCK_SIZE), RADIX_BITS=RADIX_BITS,
        num_warps=8 if block >= 2048 else 4,
    )
