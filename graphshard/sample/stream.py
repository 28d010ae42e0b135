"""The scan's streaming pass over a program's chunks of a row (`kernels._scan_kernel`): each
chunk's results (NaN flag, greedy argmax, Gumbel winner, softmax sums) stored into its column of
the row's partials, and the per-lane maxima returned for the capture that follows
(`floors`). One compiled copy of the pass per combination of what a row keeps, so that greedy
and unfiltered rows pay for nothing they skip (`benchmarks/stream_sass.py` counts each copy's
instructions per element)."""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample.rows import scan_span
from graphshard.sample.workspace import (P_ARG_X, P_ARG_Z, P_FLOOR_R, P_FLOOR_S, P_MAX_R,
                                          P_MAX_X, P_MAX_Z, P_NAN, P_SUM_R, P_SUM_S)


@triton.jit
def stream(row_ptr, mask_row_ptr, mask_on, lo, count, part, inv_temp, key, draw, sum_s, sum_r,
           filtered, CHUNK: tl.constexpr, SPLITS: tl.constexpr, VOCAB: tl.constexpr,
           BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, GROUP: tl.constexpr):
    """The streaming pass over `count` chunks from `lo` (`stream_chunks`), in one copy per
    combination a row can ask for, so that greedy and unfiltered rows pay for nothing they
    skip: the Gumbel winner only for `draw` rows, each softmax sum only for the rows that use it
    (`sum_s`: top-p without a small top-k; `sum_r`: logprobs). A `draw` row with `sum_s` is a
    top-p row without top-k and min-p. -> the per-lane maxima over the chunks (masked, raw)
    [BLOCK], which only rows that capture use."""
    span = (row_ptr, mask_row_ptr, mask_on, lo, count, part, inv_temp, key)
    if draw & sum_s:
        lanes = stream_sum_r(span, sum_r, True, True, CHUNK, SPLITS, VOCAB, BLOCK, HAS_BITMASK,
                             GROUP)
    elif draw:
        lanes = stream_sum_r(span, sum_r, True, False, CHUNK, SPLITS, VOCAB, BLOCK, HAS_BITMASK,
                             GROUP)
    elif sum_s:
        lanes = stream_sum_r(span, sum_r, False, True, CHUNK, SPLITS, VOCAB, BLOCK, HAS_BITMASK,
                             GROUP)
    elif sum_r:
        lanes = stream_chunks(span, False, False, True, CHUNK, SPLITS, VOCAB, BLOCK,
                              HAS_BITMASK, GROUP)
    elif filtered:
        lanes = stream_chunks(span, False, False, False, CHUNK, SPLITS, VOCAB, BLOCK,
                              HAS_BITMASK, GROUP)
    else:
        # A greedy row without logprobs captures nothing: its lanes' maxima are not kept across
        # chunks (no registers held through the next chunk's stream).
        lanes = stream_chunks(span, False, False, False, CHUNK, SPLITS, VOCAB, BLOCK,
                              HAS_BITMASK, GROUP, False)
    return lanes


@triton.jit
def stream_sum_r(span, sum_r, DRAW: tl.constexpr, SUM_S: tl.constexpr, CHUNK: tl.constexpr,
                 SPLITS: tl.constexpr, VOCAB: tl.constexpr, BLOCK: tl.constexpr,
                 HAS_BITMASK: tl.constexpr, GROUP: tl.constexpr):
    """`stream_chunks` with the raw logits' softmax sum only when `sum_r`."""
    if sum_r:
        lanes = stream_chunks(span, DRAW, SUM_S, True, CHUNK, SPLITS, VOCAB, BLOCK, HAS_BITMASK,
                              GROUP)
    else:
        lanes = stream_chunks(span, DRAW, SUM_S, False, CHUNK, SPLITS, VOCAB, BLOCK,
                              HAS_BITMASK, GROUP)
    return lanes


@triton.jit
def stream_chunks(span, DRAW: tl.constexpr, SUM_S: tl.constexpr, SUM_R: tl.constexpr,
                  CHUNK: tl.constexpr, SPLITS: tl.constexpr, VOCAB: tl.constexpr,
                  BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr, GROUP: tl.constexpr,
                  KEEP_LANES: tl.constexpr = True):
    """`scan_span` over each of `count` chunks from `lo`, each chunk's results stored into its
    column of the row's partials `part` as a program of its own would store them (the same
    reductions in the same order: a row's results do not depend on how many chunks a program
    streams) -> the per-lane maxima over all of them (masked, raw) [BLOCK]; without
    KEEP_LANES, over the last chunk only. A row's last program may have fewer than GROUP chunks:
    it skips those past `count`. `span`: (row_ptr, mask_row_ptr, mask_on, lo, count, part,
    inv_temp, key)."""
    row_ptr, mask_row_ptr, mask_on, lo, count, part, inv_temp, key = span
    nan, max_x, arg_x, max_z, arg_z, lane_x, lane_r, mass_s, mass_r = scan_span(
        row_ptr, mask_row_ptr, mask_on, lo, inv_temp, key, DRAW, SUM_S, SUM_R, CHUNK, VOCAB,
        BLOCK, HAS_BITMASK)
    store_scan(part, nan, max_x, arg_x, max_z, arg_z, tl.max(lane_r, axis=0), mass_r, mass_s,
               SPLITS)
    for c in tl.static_range(1, GROUP):
        if c < count:
            nan, max_x, arg_x, max_z, arg_z, chunk_x, chunk_r, mass_s, mass_r = scan_span(
                row_ptr, mask_row_ptr, mask_on, lo + c * CHUNK, inv_temp, key, DRAW, SUM_S,
                SUM_R, CHUNK, VOCAB, BLOCK, HAS_BITMASK)
            store_scan(part + c, nan, max_x, arg_x, max_z, arg_z, tl.max(chunk_r, axis=0),
                       mass_r, mass_s, SPLITS)
            if KEEP_LANES:
                lane_x = tl.maximum(lane_x, chunk_x)
                if HAS_BITMASK:
                    lane_r = tl.maximum(lane_r, chunk_r)
            else:
                lane_x, lane_r = chunk_x, chunk_r
    if not HAS_BITMASK:
        lane_r = lane_x  # every token is allowed: the raw maxima are the masked ones
    return lane_x, lane_r


@triton.jit
def store_scan(out, nan, max_x, arg_x, max_z, arg_z, max_r, sum_r, sum_s, SPLITS: tl.constexpr):
    """A chunk's streaming results, one word per field, into its column of the row's partials."""
    tl.store(out + P_NAN * SPLITS, nan)
    tl.store(out + P_MAX_X * SPLITS, max_x.to(tl.int32, bitcast=True))
    tl.store(out + P_ARG_X * SPLITS, arg_x)
    tl.store(out + P_MAX_Z * SPLITS, max_z.to(tl.int32, bitcast=True))
    tl.store(out + P_ARG_Z * SPLITS, arg_z)
    tl.store(out + P_MAX_R * SPLITS, max_r.to(tl.int32, bitcast=True))
    tl.store(out + P_SUM_R * SPLITS, sum_r.to(tl.int32, bitcast=True))
    tl.store(out + P_SUM_S * SPLITS, sum_s.to(tl.int32, bitcast=True))


@triton.jit
def store_floors(out, floor_s, floor_r, SPLITS: tl.constexpr):
    """A chunk's capture floors into its column of the row's partials."""
    tl.store(out + P_FLOOR_S * SPLITS, floor_s.to(tl.int32, bitcast=True))
    tl.store(out + P_FLOOR_R * SPLITS, floor_r.to(tl.int32, bitcast=True))
