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
`grid.SPLITS_PER_PROGRAM`, but one in rows of at most SMALL_ROW_SPLITS chunks, which capture
more per chunk; one compiled scan per GROUP). `graphshard.sample.grid` sets the launches' shapes
and options. Two launches:
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
   (`grid.FINISH_PROGRAMS`), else 1: at small batch a top-p row without top-k and min-p has its
   pool weighed by all of its programs, a slice each, and the last to arrive settles the threshold's
   interval (`graphshard.sample.nucleus`); every other row is settled by its first program while
   the rest exit.
   The greedy and unfiltered tokens combine the chunks; top-k, top-p, min-p and the top-K
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

from graphshard.sample import rng
from graphshard.runtime.launch import check_int32_vector, launch
from graphshard.sample import checks, grid
from graphshard.runtime.pdl import check_pdl, pdl_options, follow_producer
from graphshard.sample.params import SLOT_WIDTH, SlotTables
from graphshard.sample.records import RecordLayout
from graphshard.sample.deep import no_interval
from graphshard.sample.nucleus import close_pool, split_nucleus
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

# Pool entries a finish program weighs at most (fewer where the pool is smaller).
MAX_SLICE = 256
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
    `splits_per_program` (1 to `grid.MAX_SPLITS_PER_PROGRAM`) the vocabulary chunks a scan program
    streams (by default `grid.SPLITS_PER_PROGRAM` of the grid's rows; one compiled scan per value),
    `finish_programs` (1, 2, 4, 8 or 16) the programs per row of the finish (by default
    `grid.FINISH_PROGRAMS`; fewer where the workspace has no room); none changes a result. `pdl`
    launches both kernels as programmatic dependents of the kernel before each (compute
    capability 9.0+, `graphshard.runtime.pdl`): the same results, scheduled earlier."""
    checks.check_logits(logits, vocab_size, max_num_reqs, layout)
    device = logits.device
    num_rows = logits.shape[0]
    check_pdl(pdl, device, "sample")
    check_int32_vector("num_reqs", num_reqs, 1, device, where="logits")
    check_int32_vector("req_slots", req_slots, max_num_reqs, device, where="logits")
    check_int32_vector("cu_num_logits", cu_num_logits, max_num_reqs + 1, device, where="logits")
    check_int32_vector("seq_lens", seq_lens, max_num_reqs, device, where="logits")
    checks.check_tables(tables, device)
    checks.check_records(records, layout, max_num_reqs, device)
    if draft_tokens is not None:
        check_int32_vector("draft_tokens", draft_tokens, num_rows, device, where="logits")
    checks.check_bitmask(bitmask, bitmask_rows, bitmask_enabled, bitmask_words(vocab_size),
                         num_rows, device)
    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    if k > MAX_LOGPROBS.value:
        raise ValueError(f"layout.num_logprobs must be <= {MAX_LOGPROBS.value}, got {k}")
    block = grid.tile_block(vocab_size, padded(k), block_size)
    if workspace is None:
        workspace = SamplerWorkspace.allocate(max_num_reqs, m, vocab_size, device)
    checks.check_workspace(workspace, vocab_size, layout, max_num_reqs, device)
    if max_num_reqs == 0:
        return

    chunk, splits, cap = workspace.chunk_size, workspace.num_splits, workspace.pool_size
    # Powers of two: the scan's tile divides its chunk.
    chunk_block = min(block, chunk, grid.SCAN_BLOCK_SIZE)
    mask = Bitmask(bitmask, bitmask_rows) if bitmask is not None else None
    bitmask_stride = bitmask.stride(0) if bitmask is not None else 0
    batch = (num_reqs, req_slots, cu_num_logits, seq_lens)
    logits_arg = (logits, logits.stride(0))
    # The slot tables and the workspace are fixed for the sampler's lifetime: one tuple.
    buffers_arg = ((tables.packed, workspace.buffer), workspace.max_num_reqs * m)
    sizes = dict(VOCAB=vocab_size, M=m, K=k, SPLITS=splits, CAP=cap, BLOCK=chunk_block)
    dependent = pdl_options(pdl)
    group = grid.scan_group(max_num_reqs * m, splits, splits_per_program)
    scan_grid = (max_num_reqs * m, -(-splits // group))
    programs = grid.finish_programs(max_num_reqs * m, splits, cap, vocab_size, finish_programs)
    scan_sizes = dict(sizes, CHUNK=chunk, GROUP=group, NUCLEUS_WINNER=nucleus_winner(programs))
    launch(_scan_kernel, scan_grid, logits_arg, *batch, mask, bitmask_stride, bitmask_enabled,
           *buffers_arg, **scan_sizes, **dependent,
           **grid.scan_options(bitmask is not None, chunk_block))
    if bitmask_enabled is not None:
        # The variant for steps whose flag is off (see `_scan_kernel`).
        launch(_scan_kernel, scan_grid, logits_arg, *batch, None, 0, bitmask_enabled,
               *buffers_arg, **scan_sizes, **dependent, **grid.scan_options(False, chunk_block))
    options = grid.finish_options(max_num_reqs * m, programs, chunk_block)
    launch(_finish_kernel, (max_num_reqs * m, programs), logits_arg, *batch, mask,
           bitmask_stride, bitmask_enabled, *buffers_arg,
           (records, records.stride(0)), draft_tokens, **sizes, **dependent,
           SMALL_BLOCK=min(block, grid.SMALL_BLOCK_SIZE), PROGRAMS=programs,
           COUNT_TILES=grid.count_tiles(options), **options)
