"""Triton device functions that write a request's packed record (`records.RecordLayout`) in
the finish, once its rows have settled: a one-row request's record from its token, and a
speculative request's from all its rows' tokens, verified against its drafts by the last of
its rows to arrive (an arrival counter in the workspace).

Drafts are accepted along the longest prefix of rows whose sample equals the draft; the first
mismatch is the correction token, and the rows past it report -1 and blank logprobs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from graphshard.sample.resolve import has_nan, store_logprobs
from graphshard.sample.workspace import padded, workspace_row


@triton.jit
def arrive(counter_ptr, count):
    """Count this program in; True for the last of `count` programs, which then sees every
    other program's stores (release/acquire at GPU scope) and resets the counter."""
    tl.debug_barrier()
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == count - 1
    if last:
        tl.store(counter_ptr, 0)
    tl.debug_barrier()
    return last


@triton.jit
def assemble_record(rec_ptr, token, num_nans, accepted, num_logprobs, M: tl.constexpr,
                    K: tl.constexpr):
    """A one-row request's record: its token, 1 sampled, 0 rejected, its NaN count."""
    tl.store(rec_ptr, token)
    tl.store(rec_ptr + M, accepted + 1)
    tl.store(rec_ptr + M + 1, 0)
    tl.store(rec_ptr + M + 2, num_nans)
    if K > 0:
        if num_logprobs == 0:
            _blank_logprobs(rec_ptr, 0, M, K)


@triton.jit
def assemble_drafts(rec_ptr, tokens, workspace, req, first_row, m, draft_ptr, num_logprobs,
                    M: tl.constexpr, K: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr):
    """A request's record from its rows' tokens: drafts accepted along the longest matching
    prefix (the first mismatch is the correction token), tokens past it -1, logprobs blank."""
    M_P: tl.constexpr = triton.next_power_of_2(M)
    at = tl.arange(0, M_P)
    samples = tl.load(tokens + at, mask=at < m, other=-1, cache_modifier=".cg")
    drafts = tl.full([M_P], -1, tl.int32)
    if draft_ptr is not None:
        drafts = tl.load(draft_ptr + first_row + at, mask=at < m - 1, other=-1)
    reject = (at < m - 1) & (samples != drafts)
    accepted = tl.min(tl.where(reject, at, m - 1), axis=0)
    num_nans = 0
    for r in range(0, M):
        if r < m:
            part = workspace_row(workspace, req * M + r, SPLITS, CAP)[0]
            num_nans += has_nan(part, SPLITS)
    tl.store(rec_ptr + at, tl.where(at <= accepted, samples, -1), mask=at < M)
    tl.store(rec_ptr + M, accepted + 1)
    tl.store(rec_ptr + M + 1, m - 1 - accepted)
    tl.store(rec_ptr + M + 2, num_nans)
    if K > 0:
        for r in range(0, M):
            # Rows up to `accepted` hold their logprobs (written when the slot wants them).
            if (r > accepted) | (num_logprobs == 0):
                _blank_logprobs(rec_ptr, r, M, K)


@triton.jit
def _blank_logprobs(rec_ptr, r, M: tl.constexpr, K: tl.constexpr):
    empty = tl.full([padded(K)], -1, tl.int32)
    store_logprobs(rec_ptr, r, empty, empty.to(tl.float32),
                   tl.full((), float("-inf"), tl.float32), tl.full((), 0, tl.int32), 0, M, K)
