"""Graph-safe sampling of a sub-batch of requests: split-vocabulary passes, then a finish that
settles each row and assembles each request's record.

Contract
--------
Request `j` owns logits rows `cu_num_logits[j] .. cu_num_logits[j+1]-1` (`m_j` rows, at most the
layout's M; extra rows are ignored). The request count `n` is read from device memory; the grids
are static bounds (`max_num_reqs`) and programs of requests `j >= n` exit at once, so one
compiled set of kernels serves every batch size and padded requests cost nothing. Records past
`n` are not touched.

Per row, with the slot's parameters (`graphshard.sample.params.SlotTables`):
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
  `argmax_t s_t + g(seed, position, t)` over the kept tokens (`graphshard.sample.rng`: keyed by seed,
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

Results land in one packed int32 record per request (`graphshard.sample.records`).

Execution
---------
The vocabulary is cut into chunks of CHUNK columns; a program streams GROUP consecutive
chunks of a row (one at small batch, so a single row spreads over many SMs; two at large batch,
`SPLITS_PER_PROGRAM`, but one in rows of at most SMALL_ROW_SPLITS chunks, which capture more per
chunk; one compiled scan per GROUP). Two launches:
1. `_scan_kernel`, grid `(max_num_reqs * M, ceil(SPLITS / GROUP))`, launched twice when a
   device flag switches the bitmask (with and without bitmask support; the flag picks which one
   works). Each program reads each of its chunks once (`graphshard.sample.stream`) for the
   greedy argmax, the NaN flag, (unfiltered random rows, and top-p-only rows at small batch:
   `nucleus_winner`) the Gumbel-max winner and (top-p and logprob rows) the softmax sums, kept
   online per lane and stored per chunk. Rows with filters or logprobs then capture
   their candidates into the row's pool (`graphshard.sample.floors`): the program picks a
   cut from its lanes' maxima, and only the lanes whose maximum reaches it are read again
   (from L2). Min-p-only rows cut at the row maximum published so
   far plus log(min_p) and need no floor search.
2. `_finish_kernel`, grid `(max_num_reqs * M, PROGRAMS)`: settles each row
   (`graphshard.sample.resolve`) in one program. PROGRAMS is 16 for grids of at most 64 rows
   (`FINISH_PROGRAMS`), else 1: at small batch a top-p row without top-k and min-p has its pool
   weighed by all of its programs, a slice each, and the last to arrive settles the threshold's
   interval (`graphshard.sample.nucleus`); every other row is settled by its first program while
   the rest exit.
   the greedy and unfiltered tokens combine the chunks; top-k, top-p, min-p and the top-K
   logprobs come from the pool whenever their thresholds lie above every chunk's capture floor,
   which is checked, so an answer from the pool is exact. Rows the pool cannot settle
   (adversarial rows: thousands of ties at a threshold, kept sets larger than the pool) take
   whole-row passes of `graphshard.sample.rows` in this program; `SamplerWorkspace.paths`
   counts them. The last of a request's rows to settle (an arrival counter) verifies the
   drafts and writes the request's record.
Greedy and unfiltered random rows are read once in total; CHUNK depends only on the
vocabulary, and every chunk's partial results are the same whatever GROUP is, so a row's
results do not depend on the batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from graphshard import config
from graphshard.sample import rng
from graphshard.runtime.launch import check_int32_vector, launch
from graphshard.runtime.pdl import check_pdl, pdl_options, follow_producer
from graphshard.sample.params import SLOT_WIDTH, SlotTables
from graphshard.sample.records import RecordLayout
from graphshard.sample.candidates import STAT_WORDS
from graphshard.sample.deep import no_interval
from graphshard.sample.nucleus import COUNT_BITS, MAX_PROGRAMS, close_pool, split_nucleus
from graphshard.sample.assemble import arrive, assemble_drafts, assemble_record
from graphshard.sample.resolve import has_nan, settle_logprobs, settle_token
from graphshard.sample.rows import top_p_only, uses_filters
from graphshard.sample.stream import store_floors, stream
from graphshard.sample.floors import (capture_above_floors, capture_hot, floor_lanes,
                                      share_floor)
from graphshard.sample.workspace import (CHUNK_TOP, HOT_LANES, MAX_LOGPROBS,
                                          SMALL_ROW_CHUNK_TOP, SMALL_ROW_SPLITS, SMALL_TOP_K,
                                          SamplerWorkspace, padded, workspace_request,
                                          workspace_row)

__all__ = ["SamplerWorkspace", "sample"]

LOGITS_DTYPES = tuple(getattr(torch, name) for name in config.LOGITS_DTYPES)
_DTYPE_NAMES = ", ".join(config.LOGITS_DTYPES[:-1]) + " or " + config.LOGITS_DTYPES[-1]
# Launch option of both kernels: no fused multiply-add. A score `x * inv_temp` must round the
# same wherever it is computed (the scan, the pool, the reference): fused into `x * inv_temp -
# max` it keeps the product's rounding error, which at a temperature of 1e-30 is ~1e24.
NO_FMA = dict(enable_fp_fusion=False)
MAX_BLOCK_SIZE = 2048
# Tile of the split scan: 1024 columns over 8 warps keep its per-lane state within 64 registers
# (four programs per SM); 2048 needed ~150.
SCAN_BLOCK_SIZE = 1024
# Registers per thread of the scan without bitmask support: 64 * 256 threads fit four programs
# per SM (`scan_options`).
LEAN_SCAN_REGISTERS = 64
# Vocabulary chunks a scan program streams, by the rows of the launch's grid (its static bound,
# so a captured graph keeps its choice): at large batch one capture step per several chunks
# costs less than one per chunk, at small batch a row needs every program it can get. A
# program's chunks keep their own partial results, so the choice changes no result. On an H200
# (BENCHMARKS.md, V = 152064 fp32, batch 1024) two chunks make the top-k + top-p scan 14 %
# faster (363 -> 311 µs) and the greedy scan 3 % slower (168 -> 173; the two-chunk scan
# spills); four leave top-p nuclei out of the pools. Rows of at most SMALL_ROW_SPLITS chunks
# keep one chunk per program (`_splits_per_program`).
SPLITS_PER_PROGRAM = ((256, 2),)
# Programs the finish gives each row, by the rows of its grid (a static bound, like the scan's
# chunks per program, so a captured graph keeps its choice): at small batch a top-p row's large
# pool is drawn by several of them (`nucleus`); at large batch the rows alone fill the GPU.
FINISH_PROGRAMS = ((64, 16),)
# A one-program finish of 8 warps over a grid of at least FINISH_CAPPED_ROWS rows is held to
# FINISH_REGISTERS per thread (ptxas spills ~1.5 KB): four programs per SM instead of two
# (128 registers without bitmask support; ~170 with it, one per SM), which a batch that fills
# the GPU with rows alone turns into speed and a smaller one does not (BENCHMARKS.md, H200, the
# finish without bitmask support: at batch 1024 20-37 % less time at V = 152064 fp32, 36-60 %
# at 128256 bf16; at 256 up to 5 % more). The same code and layouts, so the same results: 4
# warps instead, as fast, would change the order of the finish's block-wide sums.
FINISH_CAPPED_ROWS = 512
FINISH_REGISTERS = 64
# A finish that splits rows over programs (8 warps) is held to SPLIT_FINISH_REGISTERS, two
# programs per SM: ptxas chose 128 for it (spilling 168 bytes) until the deep draw's first
# round by the row's programs (`deep_split`), then 191-196 with no spill, which leaves one
# program per SM for every mode of the small batches (CPU compile, sm_90a).
SPLIT_FINISH_REGISTERS = 128
# Pool entries a finish program weighs at most (fewer where the pool is smaller).
MAX_SLICE = 256
# The scan unrolls its chunk loop: a bound on its code size.
MAX_SPLITS_PER_PROGRAM = 4
# Tile of the whole-row paths: their wider per-token state would cost registers.
SMALL_BLOCK_SIZE = 512
POOL_TILE = 1024
# Bits of a threshold decided per pass of a radix search: 16 candidates, 8 passes.
RADIX_BITS = tl.constexpr(4)
SLOT_ROW = tl.constexpr(SLOT_WIDTH)


class Bitmask(NamedTuple):
    """The grammar bitmask of a launch; the kernels take None for none. Its row stride is a
    separate, unspecialised argument: the engine's rows are as wide as the padded vocabulary,
    a caller's (the oracle's) may be as wide as the real one."""

    words: torch.Tensor  # [num_bitmask_rows, >= ceil(vocab / 32)] int32
    rows: torch.Tensor  # [num_rows] int32: the bitmask row of each logits row


def bitmask_words(vocab: int) -> int:
    """Words of a bitmask row that covers `vocab` tokens (token t is bit t % 32 of word t // 32)."""
    return -(-vocab // 32)


# Sizes the kernels derive from their constexprs (plain Python, run when a kernel compiles).
@triton.constexpr_function
def small_top_k(block):
    """The largest top-k whose rows capture k candidates per scan program."""
    return min(SMALL_TOP_K, floor_lanes(block))


@triton.constexpr_function
def chunk_top(block, splits):
    """Candidates a chunk keeps for filters without a small top-k (and the rank of a token): more
    in a row of few chunks."""
    top = SMALL_ROW_CHUNK_TOP if splits <= SMALL_ROW_SPLITS else CHUNK_TOP
    return min(top, floor_lanes(block))


@triton.constexpr_function
def pool_tile(cap, k):
    return max(min(POOL_TILE, cap), padded(k))


@triton.constexpr_function
def finish_slice(cap, programs):
    """Pool entries each of a row's finish programs weighs (`nucleus.split_nucleus`)."""
    return min(MAX_SLICE, cap // programs)


# Arguments that travel together go as tuples: (pointer, row stride) of the logits and of the
# records, the Bitmask, and the sampler's own buffers (slot tables, workspace); optional inputs are
# None when absent (the kernels test for None at compile time). Triton specialises a tuple's
# elements whatever the parameter's options (an int on being 1 or divisible by 16, a pointer on
# 16-byte alignment), so a tuple holds only what is fixed for a caller's lifetime; a stride
# divisible by 16 lets the row loads vectorise. Nothing that varies per step is an int argument,
# and ints that differ between callers stay separate and unspecialised: the workspace's row count
# (one compiled kernel serves every workspace) and the bitmask's row stride.
# The per-request inputs are read a word at a time, so their alignment buys nothing: they stay
# separate pointers, not specialised on it, so that the engine (views into one staging buffer)
# and a caller with fresh tensors (the oracle) share one compiled kernel.
_NOT_SPECIALISED = ["bitmask_stride", "rows"]
_ANY_ALIGNMENT = ["num_reqs_ptr", "req_slots_ptr", "cu_num_logits_ptr", "seq_lens_ptr",
                  "bitmask_on_ptr", "draft_ptr"]


# --------------------------------------------------------------------------- shared set-up


@triton.jit
def _open_row(num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr, seq_lens_ptr, row_id,
              M: tl.constexpr):
    """Both launches' first step: (live: the row's request is live and has the row, request,
    row within it, first logits row, row count m <= M, seq_len, slot)."""
    req = row_id // M
    r = row_id % M
    live = req < tl.load(num_reqs_ptr)
    # The launcher checks that every per-request array holds max_num_reqs (+ 1) entries, and the
    # grid has no request past that: the loads need not wait for `n` (one memory round trip
    # less before the first logits load). A dead request's values are never used.
    first_row = tl.load(cu_num_logits_ptr + req)
    m = tl.minimum(tl.load(cu_num_logits_ptr + req + 1) - first_row, M)
    return (live & (r < m), req, r, first_row, m, tl.load(seq_lens_ptr + req),
            tl.load(req_slots_ptr + req))


@triton.jit
def _row_inputs(logits, mask, bitmask_stride, slots_ptr, slot, row, position, VOCAB: tl.constexpr,
                K: tl.constexpr):
    """Both launches' set-up of a live row -> (logits row pointer, bitmask row pointer, RNG key,
    and the slot's 1 / temperature (1 when greedy), top_k, top_p, min_p, logprobs wanted (<= K),
    random, filtered)."""
    params = slots_ptr + slot * SLOT_ROW
    temperature = tl.load(params).to(tl.float32, bitcast=True)
    top_k = tl.load(params + 1)
    top_p = tl.load(params + 2).to(tl.float32, bitcast=True)
    min_p = tl.load(params + 3).to(tl.float32, bitcast=True)
    num_logprobs = tl.minimum(tl.load(params + 6), K)
    is_random = temperature > 0.0
    inv_temp = 1.0 / tl.where(is_random, temperature, 1.0)
    filtered = is_random & uses_filters(top_k, top_p, min_p, VOCAB)
    key = rng.row_key(tl.load(params + 4), tl.load(params + 5), position)
    mask_row_ptr = slots_ptr  # never read without a bitmask
    if mask is not None:
        mask_row_ptr = mask.words + tl.load(mask.rows + row).to(tl.int64) * bitmask_stride
    logits_ptr, logits_stride = logits
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    return (row_ptr, mask_row_ptr, key, inv_temp, top_k, top_p, min_p, num_logprobs, is_random,
            filtered)


@triton.jit
def _mask_on(bitmask_on_ptr):
    """Whether the bitmask applies this step: always, without a per-step flag."""
    on = True
    if bitmask_on_ptr is not None:
        on = tl.load(bitmask_on_ptr) != 0
    return on


# --------------------------------------------------------------------------- launch 1: scan


@triton.jit(do_not_specialize=_NOT_SPECIALISED, do_not_specialize_on_alignment=_ANY_ALIGNMENT)
def _scan_kernel(
    logits,  # (pointer to [num_rows, padded_vocab] fp32/bf16/fp16, row stride)
    num_reqs_ptr,  # [1] int32: n
    req_slots_ptr,  # [>= n] int32
    cu_num_logits_ptr,  # [>= n + 1] int32
    seq_lens_ptr,  # [>= n] int32
    mask,  # Bitmask or None
    bitmask_stride,  # row stride of mask.words (0 without a bitmask)
    bitmask_on_ptr,  # [1] int32: 0 = this step has no bitmask; None: no per-step flag
    buffers,  # (packed SlotTables [max_num_slots, SLOT_WIDTH] int32, SamplerWorkspace.buffer)
    rows,  # rows of the workspace (max_num_reqs * M of its allocation)
    VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, CHUNK: tl.constexpr,
    SPLITS: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr,
    NUCLEUS_WINNER: tl.constexpr,  # draw a top-p-only row's unfiltered winner (`nucleus_winner`)
    PDL: tl.constexpr = False,  # launched as a programmatic dependent (`graphshard.runtime.pdl`)
):
    HAS_BITMASK: tl.constexpr = mask is not None
    slots_ptr, ws_ptr = buffers
    workspace = (ws_ptr, rows)
    SMALL_K: tl.constexpr = small_top_k(BLOCK)
    WIDE: tl.constexpr = chunk_top(BLOCK, SPLITS)
    row_id = tl.program_id(0)
    follow_producer(PDL)
    live, _, r, first_row, m, seq_len, slot = _open_row(num_reqs_ptr, req_slots_ptr,
                                                        cu_num_logits_ptr, seq_lens_ptr, row_id, M)
    mask_on = _mask_on(bitmask_on_ptr)
    if bitmask_on_ptr is not None:
        # With a device flag the launcher runs this kernel twice, with and without bitmask
        # support, and the flag picks which one works (the other's programs return at once):
        # a step without a bitmask streams in the lean variant, whose registers (64 against 108
        # with the mask, fp32) fit twice the programs per SM.
        live = live & (mask_on == HAS_BITMASK)
    if live:
        row = first_row + r
        (row_ptr, mask_row_ptr, key, inv_temp, top_k, top_p, min_p, num_logprobs, is_random,
         filtered) = _row_inputs(logits, mask, bitmask_stride, slots_ptr, slot, row, seq_len + r,
                                 VOCAB, K)
        small_k = filtered & (top_k > 0) & (top_k <= SMALL_K)
        # The unfiltered winner is the draw of an unfiltered row. A filtered row draws from its
        # pool, and its stream skips the per-token RNG, but for a top-p row without top-k and
        # min-p at small batch (NUCLEUS_WINNER): its nucleus may reach below its pool
        # (temperature ~1), and the finish then checks whether the nucleus keeps the
        # unfiltered winner, which the chunks give here for a fraction of the one-program pass
        # over the row that finds it there.
        draw = is_random & ~filtered
        if NUCLEUS_WINNER:
            draw = is_random & (~filtered | top_p_only(top_k, top_p, min_p, VOCAB))
        # The program's chunks: GROUP of them, fewer in a row's last program. Each stores its
        # own results; the capture below runs once for all of them, over their lanes' maxima.
        first = tl.program_id(1) * GROUP
        count = tl.minimum(GROUP, SPLITS - first)
        # Capture targets per program: k for a small top-k, CHUNK_TOP per chunk for other
        # filters and for the rank of a random token; the top-K logprobs otherwise.
        wide = tl.minimum(WIDE * count, floor_lanes(BLOCK))
        need_s = tl.where(filtered, tl.where(small_k, top_k, wide), 0)
        need_r = tl.where(num_logprobs > 0,
                          tl.where(small_k, tl.maximum(num_logprobs, top_k),
                                   tl.where(is_random, wide, num_logprobs)), 0)
        # The softmax sums: the scores' for a top-p norm (a small top-k's top-p is normalised
        # over its pool), the raw logits' for logprobs.
        sum_s = filtered & (top_p < 1.0) & ~small_k
        sum_r = num_logprobs > 0
        part, fill, pool_x, pool_id, stats, top, hot = workspace_row(workspace, row_id, SPLITS,
                                                                     CAP)
        hot = hot + tl.program_id(1) * HOT_LANES  # this program's list of hot lanes
        lo = first * CHUNK
        lane_x, lane_r = stream(row_ptr, mask_row_ptr, mask_on, lo, count, part + first, inv_temp,
                                key, draw, sum_s, sum_r, filtered, CHUNK, SPLITS, VOCAB,
                                BLOCK, HAS_BITMASK, GROUP)
        floor_s = tl.full((), float("inf"), tl.float32)
        floor_r = tl.full((), float("inf"), tl.float32)
        min_p_only = filtered & (top_p >= 1.0) & ((top_k <= 0) | (top_k >= VOCAB)) \
            & (num_logprobs == 0)
        # A one-chunk vocabulary is settled by whole-row passes: nothing to capture.
        if (SPLITS > 1) & min_p_only:
            # Min-p keeps s >= max s + log(min_p). The largest chunk maximum published so far
            # bounds the row's from below (the same rounding as the finish's), so the chunk
            # captures above that bound and leaves out nothing min-p can keep: its floor is
            # -inf, and no floor search is needed.
            row_max = share_floor(fill, tl.max(lane_x, axis=0))
            floor_s = tl.full((), float("-inf"), tl.float32)
            capture_hot(row_ptr, mask_row_ptr, mask_on, lo, fill, pool_x, pool_id, hot, lane_x,
                        lane_r, inv_temp, row_max * inv_temp + tl.log(min_p), float("inf"),
                        VOCAB, CHUNK, CAP, BLOCK, HAS_BITMASK, GROUP)
        elif (SPLITS > 1) & ((need_s > 0) | (need_r > 0)):
            floor_s, floor_r = capture_above_floors(row_ptr, mask_row_ptr, mask_on, lo, fill,
                                                    pool_x, pool_id, hot, lane_x, lane_r,
                                                    need_s, need_r, VOCAB, CHUNK, CAP, BLOCK,
                                                    HAS_BITMASK, GROUP)
        store_floors(part + first, floor_s, floor_r, SPLITS)
        for c in tl.static_range(1, GROUP):
            if c < count:
                store_floors(part + first + c, floor_s, floor_r, SPLITS)


# --------------------------------------------------------------------------- launch 2: records


@triton.jit(do_not_specialize=_NOT_SPECIALISED, do_not_specialize_on_alignment=_ANY_ALIGNMENT)
def _finish_kernel(
    logits, num_reqs_ptr, req_slots_ptr, cu_num_logits_ptr, seq_lens_ptr, mask, bitmask_stride,
    bitmask_on_ptr, buffers, rows,  # as _scan_kernel
    records,  # (pointer to [>= n, RecordLayout.width] int32, row stride)
    draft_ptr,  # [num_rows] int32, or None: no drafts
    VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, SPLITS: tl.constexpr,
    CAP: tl.constexpr, BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr,
    PROGRAMS: tl.constexpr,
    PDL: tl.constexpr = False,  # as _scan_kernel
    COUNT_TILES: tl.constexpr = 4,  # tiles a step of a count over the row (`count_tiles`)
):
    HAS_BITMASK: tl.constexpr = mask is not None
    SLICE: tl.constexpr = finish_slice(CAP, PROGRAMS)
    # The scan's choice, by the same programs: whether it drew top-p-only rows' winners.
    NUCLEUS_WINNER: tl.constexpr = nucleus_winner(PROGRAMS)
    slots_ptr, ws_ptr = buffers
    workspace = (ws_ptr, rows)
    row_id = tl.program_id(0)
    follow_producer(PDL)
    live, req, r, first_row, m, seq_len, slot = _open_row(num_reqs_ptr, req_slots_ptr,
                                                          cu_num_logits_ptr, seq_lens_ptr, row_id,
                                                          M)
    if live:
        mask_on = _mask_on(bitmask_on_ptr)
        (row_ptr, mask_row_ptr, key, inv_temp, top_k, top_p, min_p, num_logprobs, is_random,
         filtered) = _row_inputs(logits, mask, bitmask_stride, slots_ptr, slot, first_row + r,
                                 seq_len + r, VOCAB, K)
        part, fill, pool_x, pool_id, stats, top, hot = workspace_row(workspace, row_id, SPLITS,
                                                                     CAP)
        row = (row_ptr, mask_row_ptr, mask_on, key, inv_temp, top_k, top_p, min_p,
               num_logprobs, is_random, filtered)
        request = (req, r, first_row, m)
        if PROGRAMS == 1:
            pool = (part, _take_pool(fill), pool_x, pool_id, stats)
            # Only this finish races a top-p draw (`candidates.search_mass`): the split
            # finish's code is what small batches wait on, and it splits those rows anyway.
            _settle_row(row, None, pool, top, records, draft_ptr, workspace, request, VOCAB, M, K,
                        SPLITS, CAP, BLOCK, SMALL_BLOCK, HAS_BITMASK, NUCLEUS_WINNER, COUNT_TILES,
                        True)
        else:
            # Only a top-p row without top-k and min-p may be split over the row's programs; the
            # first program settles any other row alone, and the others leave at once. One call
            # of `_settle_row` for both kinds of row: each call is inlined, and a second copy
            # doubled the kernel's code (instruction fetch is what small batches wait on).
            nucleus = is_random & top_p_only(top_k, top_p, min_p, VOCAB)
            n_pool = tl.zeros((), tl.int32)
            settles = tl.program_id(1) == 0
            no = tl.program_id(1) < 0
            drawn_before = (no, no, n_pool, no_interval())
            if nucleus:
                n_pool, settles, drawn_before = split_nucleus(fill, part, pool_x, pool_id, hot,
                                                              stats, row, VOCAB, SPLITS, PROGRAMS,
                                                              SLICE, CAP, SMALL_BLOCK,
                                                              HAS_BITMASK)
            elif settles:
                n_pool = _take_pool(fill)
            if settles:
                pool = (part, n_pool, pool_x, pool_id, stats)
                _settle_row(row, drawn_before, pool, top, records, draft_ptr, workspace, request,
                            VOCAB, M, K, SPLITS, CAP, BLOCK, SMALL_BLOCK, HAS_BITMASK,
                            NUCLEUS_WINNER, COUNT_TILES, False)


@triton.jit
def _take_pool(fill):
    """The pool count of a row one program settles, the pool word reset for the next launch."""
    n_pool = tl.load(fill, cache_modifier=".cg")
    # Every thread reads the count before any resets it (each thread loads it itself).
    tl.debug_barrier()
    close_pool(fill)
    return n_pool


@triton.jit
def _settle_row(row, drawn_before, pool, top, records, draft_ptr, workspace, request,
                VOCAB: tl.constexpr, M: tl.constexpr, K: tl.constexpr, SPLITS: tl.constexpr,
                CAP: tl.constexpr, BLOCK: tl.constexpr, SMALL_BLOCK: tl.constexpr,
                HAS_BITMASK: tl.constexpr, NUCLEUS_WINNER: tl.constexpr,
                COUNT_TILES: tl.constexpr, RACE: tl.constexpr):
    """A row's token, logprobs and (its request's last row) record, in the one program of the
    finish that settles the row. `row`: the mask flag and `_row_inputs`' results (as
    `resolve.settle_token` takes them); `pool`: the row's (partials, pool count, pool logits,
    pool ids, stats); `request`: (request, row within it, its first row, its rows);
    `drawn_before`: see `resolve.settle_token`; RACE: the top-p search may race the draw
    (`candidates.search_mass`)."""
    row_ptr, _mask_row, mask_on, _key, _inv_temp, top_k, _top_p, _min_p, num_logprobs, \
        is_random, filtered = row
    req, r, first_row, m = request
    part = pool[0]
    TILE: tl.constexpr = pool_tile(CAP, K)
    SMALL_K: tl.constexpr = small_top_k(BLOCK)
    small_k = filtered & (top_k > 0) & (top_k <= SMALL_K)
    token = settle_token(pool, row, small_k, drawn_before, top, VOCAB, SPLITS, CAP, TILE, BLOCK,
                         SMALL_BLOCK, HAS_BITMASK, RADIX_BITS, NUCLEUS_WINNER, COUNT_TILES, RACE)
    records_ptr, records_stride = records
    rec_ptr = records_ptr + req.to(tl.int64) * records_stride
    if K > 0:
        if num_logprobs > 0:
            # A greedy token is the argmax of the masked logits: without a bitmask, the row's
            # largest raw logit.
            at_max = ~is_random
            if HAS_BITMASK:
                at_max = at_max & (mask_on == 0)  # a constant True without a step flag
            settle_logprobs(pool, top, rec_ptr, row_ptr, r, token, at_max, num_logprobs, VOCAB,
                            M, K, SPLITS, CAP, TILE, BLOCK, SMALL_BLOCK, COUNT_TILES)
    if M == 1:
        assemble_record(rec_ptr, token, has_nan(part, SPLITS), 0, num_logprobs, M, K)
    else:
        # The request's rows settle in parallel; the last to finish verifies the drafts.
        tokens, arrivals = workspace_request(workspace, req, M, SPLITS, CAP)
        tl.store(tokens + r, token)
        if arrive(arrivals, m):
            assemble_drafts(rec_ptr, tokens, workspace, req, first_row, m, draft_ptr,
                            num_logprobs, M, K, SPLITS, CAP)


# --------------------------------------------------------------------------- host side


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
        words = bitmask_words(vocab_size)
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


def _tile_options(block: int) -> dict:
    """Both kernels' options for a tile of `block` columns: 8 warps from 1024 columns."""
    return dict(num_warps=8 if block >= 1024 else 4, **NO_FMA)


def scan_options(has_bitmask: bool, block: int) -> dict:
    """Launch options of `_scan_kernel`'s variant. The variant without bitmask support is held to
    LEAN_SCAN_REGISTERS: it streams at memory speed only with four programs of 8 warps per SM, and
    left alone ptxas gives it a few registers more than that for code that runs after the
    stream (it fits in 64 with no spills when asked)."""
    options = _tile_options(block)
    if not has_bitmask:
        options["maxnreg"] = LEAN_SCAN_REGISTERS
    return options


def _splits_per_program(grid_rows: int, splits: int, override: int | None) -> int:
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) \
                or not 1 <= override <= MAX_SPLITS_PER_PROGRAM:
            raise ValueError(f"splits_per_program must be an int in [1, "
                             f"{MAX_SPLITS_PER_PROGRAM}], got {override!r}")
        return min(override, max(splits, 1))
    group = 1
    for rows, per_program in SPLITS_PER_PROGRAM:
        if grid_rows >= rows:
            group = per_program
    if splits <= SMALL_ROW_SPLITS:
        # Two of a small row's chunks would need twice its larger capture (`chunk_top`) from
        # one program, past its HOT_LANES: on an H100 at V = 32000 bf16 that doubled the top-p
        # scan at batch 256 and 1024; one chunk per program cost greedy 0.6-1.8 µs there
        # (BENCHMARKS.md).
        group = 1
    return min(group, max(splits, 1))


def finish_options(grid_rows: int, programs: int, block: int) -> dict:
    """Launch options of `_finish_kernel` (see FINISH_CAPPED_ROWS)."""
    options = _tile_options(block)
    if options["num_warps"] == 8 and programs == 1 and grid_rows >= FINISH_CAPPED_ROWS:
        options["maxnreg"] = FINISH_REGISTERS
    elif options["num_warps"] == 8 and programs > 1:
        options["maxnreg"] = SPLIT_FINISH_REGISTERS
    return options


def count_tiles(options: dict) -> int:
    """Tiles a step of the finish's counts over a row (`resolve.count_row`): four, all loaded
    before any is counted, except in a finish held to FINISH_REGISTERS. On an H100 a row's count
    at V = 152064 fp32 took ~23 µs against ~39 with one tile a step; the held finish's code,
    which no row of those batches counts, made its logprob rows ~1 µs slower at batch 1024 with
    four (BENCHMARKS.md), so it keeps one."""
    return 1 if options.get("maxnreg") == FINISH_REGISTERS else 4


def _finish_programs(grid_rows: int, splits: int, cap: int, vocab_size: int,
                     override: int | None) -> int:
    """Programs per row of the finish (each weighs `finish_slice` pool entries)."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) \
                or override not in (1, 2, 4, 8, 16) or override > MAX_PROGRAMS.value:
            raise ValueError(f"finish_programs must be 1, 2, 4, 8 or 16, got {override!r}")
        programs = override
    else:
        programs = next((p for rows, p in FINISH_PROGRAMS if grid_rows <= rows), 1)
    # Each program's results go to the row's hot-lane scratch; the pool count word holds the
    # count below the arrival fields; a slice under 16 entries is not worth a program.
    while programs > 1 and (programs * STAT_WORDS.value > splits * HOT_LANES.value
                            or cap // programs < 16):
        programs //= 2
    if splits < 2 or vocab_size >= 2**COUNT_BITS.value:
        programs = 1
    return programs


@triton.constexpr_function
def nucleus_winner(programs):
    """Whether the scan draws a top-p-only row's unfiltered winner, which the finish needs when
    the row's nucleus reaches below its pool. Where the finish splits rows over programs (small
    batch) one row's one-program pass over its vocabulary to find the winner holds up the whole
    step (an H200 at V = 128256, batch 32, one such row: a finish of 101-110 µs against 22 with
    the winner from the scan, which costs the top-p scan 2.4-3 µs at batch 1 and 3.4-4.5 µs at
    batch 32, BENCHMARKS.md); at large batch the rows' finishes overlap, and the scan's RNG
    would cost every top-p row's stream."""
    return programs > 1


def sample(logits: torch.Tensor, *, vocab_size: int, num_reqs: torch.Tensor,
           req_slots: torch.Tensor, cu_num_logits: torch.Tensor, seq_lens: torch.Tensor,
           tables: SlotTables, layout: RecordLayout, records: torch.Tensor, max_num_reqs: int,
           draft_tokens: torch.Tensor | None = None, bitmask: torch.Tensor | None = None,
           bitmask_rows: torch.Tensor | None = None, bitmask_enabled: torch.Tensor | None = None,
           workspace: SamplerWorkspace | None = None, block_size: int | None = None,
           splits_per_program: int | None = None, finish_programs: int | None = None,
           pdl: bool = False) -> None:
    """Sample every request of a sub-batch into `records` [>= max_num_reqs, layout.width].

    `num_reqs` [1] int32 holds n on the device; `max_num_reqs` is the static grid bound. With a
    preallocated `workspace` (`SamplerWorkspace.allocate`) it never syncs with the host and
    allocates nothing, so it can run inside a captured graph; without one it allocates a
    workspace per call (eager use only). `block_size` (power of two) overrides the vocab tile,
    `splits_per_program` (1 to MAX_SPLITS_PER_PROGRAM) the vocabulary chunks a scan program
    streams (by default `SPLITS_PER_PROGRAM` of the grid's rows; one compiled scan per value),
    `finish_programs` (1, 2, 4, 8 or 16) the programs per row of the finish (by default
    `FINISH_PROGRAMS`; fewer where the workspace has no room); none changes a result. `pdl`
    launches both kernels as programmatic dependents of the kernel before each (compute
    capability 9.0+, `graphshard.runtime.pdl`): the same results, scheduled earlier."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits must be {_DTYPE_NAMES}, got {logits.dtype}")
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
    check_pdl(pdl, device, "sample")
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
    if k > MAX_LOGPROBS.value:
        raise ValueError(f"layout.num_logprobs must be <= {MAX_LOGPROBS.value}, got {k}")
    block = _block_size(vocab_size, padded(k), block_size)
    if workspace is None:
        workspace = SamplerWorkspace.allocate(max_num_reqs, m, vocab_size, device)
    _check_workspace(workspace, vocab_size, layout, max_num_reqs, device)
    if max_num_reqs == 0:
        return

    chunk, splits, cap = workspace.chunk_size, workspace.num_splits, workspace.pool_size
    # Powers of two: the scan's tile divides its chunk.
    chunk_block = min(block, chunk, SCAN_BLOCK_SIZE)
    mask = Bitmask(bitmask, bitmask_rows) if bitmask is not None else None
    bitmask_stride = bitmask.stride(0) if bitmask is not None else 0
    batch = (num_reqs, req_slots, cu_num_logits, seq_lens)
    logits_arg = (logits, logits.stride(0))
    # The slot tables and the workspace are fixed for the sampler's lifetime: one tuple.
    buffers_arg = ((tables.packed, workspace.buffer), workspace.max_num_reqs * m)
    sizes = dict(VOCAB=vocab_size, M=m, K=k, SPLITS=splits, CAP=cap, BLOCK=chunk_block)
    dependent = pdl_options(pdl)
    group = _splits_per_program(max_num_reqs * m, splits, splits_per_program)
    scan_grid = (max_num_reqs * m, -(-splits // group))
    programs = _finish_programs(max_num_reqs * m, splits, cap, vocab_size, finish_programs)
    scan_sizes = dict(sizes, CHUNK=chunk, GROUP=group, NUCLEUS_WINNER=nucleus_winner(programs))
    launch(_scan_kernel, scan_grid, logits_arg, *batch, mask, bitmask_stride, bitmask_enabled,
           *buffers_arg, **scan_sizes, **dependent, **scan_options(bitmask is not None, chunk_block))
    if bitmask_enabled is not None:
        # The variant for steps whose flag is off (see `_scan_kernel`).
        launch(_scan_kernel, scan_grid, logits_arg, *batch, None, 0, bitmask_enabled,
               *buffers_arg, **scan_sizes, **dependent, **scan_options(False, chunk_block))
    options = finish_options(max_num_reqs * m, programs, chunk_block)
    launch(_finish_kernel, (max_num_reqs * m, programs), logits_arg, *batch, mask,
           bitmask_stride, bitmask_enabled, *buffers_arg,
           (records, records.stride(0)), draft_tokens, **sizes, **dependent,
           SMALL_BLOCK=min(block, SMALL_BLOCK_SIZE), PROGRAMS=programs,
           COUNT_TILES=count_tiles(options), **options)
