"""The plan kernel: owner-sorted layout, local sub-batch and gather indices, built on the device.

One program builds the whole plan from the replicated inputs. `n` is read from device memory and
the padded maximum is a constexpr, so one compiled kernel serves every bucket and every n.
`graphshard.plan.reference.plan_ref` is the NumPy reference of the same function.

`plan` launches the plan alone; `fetch_and_plan` is the shard step's first kernel: the same
program first fetches the step's staged inputs (`graphshard.plan.staging`), then plans from them, so
the step pays one launch for both. Both run `_plan_body`, which the reference tests cover.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import check_int32_vector, launch
from graphshard.plan.layout import PlanBuffers
from graphshard.plan.staging import Staging, fetch_row

_MAX_FETCH_BLOCK = 4096


@triton.jit
def _plan_body(
    idx_mapping_ptr,  # [N] int32 slot per request
    cu_num_logits_ptr,  # [N+1] int32
    seq_lens_ptr,  # [N] int32
    num_reqs_in_ptr,  # [1] int32
    draft_tokens_ptr,  # [R] int32 (unused without HAS_DRAFTS)
    plan,  # PlanBuffers: the outputs
    max_num_reqs,
    max_num_rows,
    gather_stride,
    TP_SIZE: tl.constexpr,
    TP_RANK: tl.constexpr,
    PADDED_NUM_REQS: tl.constexpr,
    PADDED_NUM_LOGITS_PER_REQ: tl.constexpr,
    HAS_DRAFTS: tl.constexpr,
):
    reqs = tl.arange(0, PADDED_NUM_REQS)
    n = tl.load(num_reqs_in_ptr)
    live = reqs < n
    in_range = reqs < max_num_reqs
    slot = tl.load(idx_mapping_ptr + reqs, mask=live, other=0)
    row_start = tl.load(cu_num_logits_ptr + reqs, mask=live, other=0)
    num_rows = tl.load(cu_num_logits_ptr + reqs + 1, mask=live, other=0) - row_start
    owner = slot % TP_SIZE  # the ownership rule (graphshard.plan.layout.owner_ranks)

    rank_in_owner, row_in_owner, send_start, row_offset, local_reqs, local_rows = _plan_owners(
        plan, live, owner, num_rows, TP_SIZE, TP_RANK, PADDED_NUM_REQS)
    tl.store(plan.num_reqs, n)
    tl.store(plan.local_num_reqs, local_reqs)
    tl.store(plan.local_num_rows, local_rows)
    tl.store(plan.gathered_src_indices + reqs, tl.where(live, owner * gather_stride + rank_in_owner, 0),
             mask=in_range)
    local = live & (owner == TP_RANK)
    _plan_local_requests(plan, seq_lens_ptr, reqs, in_range, local, slot, num_rows, rank_in_owner,
                         row_in_owner, local_reqs, local_rows, PADDED_NUM_REQS)
    _plan_rows(plan, draft_tokens_ptr, reqs, live, local, slot, row_start, num_rows,
               row_in_owner, send_start, row_offset, local_rows, max_num_rows, PADDED_NUM_REQS,
               PADDED_NUM_LOGITS_PER_REQ, HAS_DRAFTS)


@triton.jit
def _plan_owners(plan, live, owner, num_rows, TP_SIZE: tl.constexpr, TP_RANK: tl.constexpr,
                 PADDED_NUM_REQS: tl.constexpr):
    """Per owner: counts and offsets (stored), and each request's rank and row offset within
    its owner and its first send position -> (rank_in_owner, row_in_owner, send_start, rows in
    all, this rank's requests, this rank's rows)."""
    rank_in_owner = tl.zeros([PADDED_NUM_REQS], dtype=tl.int32)
    row_in_owner = tl.zeros([PADDED_NUM_REQS], dtype=tl.int32)
    send_start = tl.zeros([PADDED_NUM_REQS], dtype=tl.int32)
    req_offset = 0
    row_offset = 0
    local_reqs = 0
    local_rows = 0
    for d in tl.static_range(TP_SIZE):
        mine = live & (owner == d)
        rows = tl.where(mine, num_rows, 0)
        reqs_incl = tl.cumsum(mine.to(tl.int32), 0)
        rows_excl = tl.cumsum(rows, 0) - rows
        count = tl.sum(mine.to(tl.int32), 0)
        total = tl.sum(rows, 0)
        rank_in_owner = tl.where(mine, reqs_incl - 1, rank_in_owner)
        row_in_owner = tl.where(mine, rows_excl, row_in_owner)
        send_start = tl.where(mine, row_offset + rows_excl, send_start)
        tl.store(plan.owner_num_reqs + d, count)
        tl.store(plan.owner_num_rows + d, total)
        tl.store(plan.owner_req_offsets + d, req_offset)
        tl.store(plan.owner_row_offsets + d, row_offset)
        if d == TP_RANK:
            local_reqs = count
            local_rows = total
        req_offset += count
        row_offset += total
    tl.store(plan.owner_req_offsets + TP_SIZE, req_offset)
    tl.store(plan.owner_row_offsets + TP_SIZE, row_offset)
    return rank_in_owner, row_in_owner, send_start, row_offset, local_reqs, local_rows


@triton.jit
def _plan_local_requests(plan, seq_lens_ptr, reqs, in_range, local, slot, num_rows,
                         rank_in_owner, row_in_owner, local_reqs, local_rows,
                         PADDED_NUM_REQS: tl.constexpr):
    """Local per-request fields: scatter live local requests to their rank, zero the tail.
    The two store sets touch disjoint addresses, so their order does not matter."""
    tail = in_range & (reqs >= local_reqs)
    tl.store(plan.local_req_indices + rank_in_owner, reqs, mask=local)
    tl.store(plan.local_idx_mapping + rank_in_owner, slot, mask=local)
    seq_len = tl.load(seq_lens_ptr + reqs, mask=local, other=0)
    tl.store(plan.local_seq_lens + rank_in_owner, seq_len, mask=local)
    tl.store(plan.local_cu_num_logits + rank_in_owner + 1, row_in_owner + num_rows, mask=local)
    zeros = tl.zeros([PADDED_NUM_REQS], dtype=tl.int32)
    tl.store(plan.local_req_indices + reqs, zeros, mask=tail)
    tl.store(plan.local_idx_mapping + reqs, zeros, mask=tail)
    tl.store(plan.local_seq_lens + reqs, zeros, mask=tail)
    tl.store(plan.local_cu_num_logits + reqs + 1, zeros + local_rows, mask=tail)
    tl.store(plan.local_cu_num_logits, 0)


@triton.jit
def _plan_rows(plan, draft_tokens_ptr, reqs, live, local, slot, row_start, num_rows, row_in_owner,
               send_start, row_offset, local_rows, max_num_rows, PADDED_NUM_REQS: tl.constexpr,
               PADDED_NUM_LOGITS_PER_REQ: tl.constexpr, HAS_DRAFTS: tl.constexpr):
    """Per-row fields: row k of request i goes to send position send_start[i] + k and, when
    local, to local row row_in_owner[i] + k. Then the row tails are zeroed: send rows past all
    live rows (`row_offset`), local rows past the local count."""
    zeros = tl.zeros([PADDED_NUM_REQS], dtype=tl.int32)
    for k in tl.static_range(PADDED_NUM_LOGITS_PER_REQ):
        has_row = live & (k < num_rows)
        src = row_start + k
        tl.store(plan.send_rows + send_start + k, src, mask=has_row)
        local_row = row_in_owner + k
        is_local_row = has_row & local
        tl.store(plan.local_row_src + local_row, src, mask=is_local_row)
        tl.store(plan.local_row_slot + local_row, slot, mask=is_local_row)
        tl.store(plan.local_row_pos + local_row, zeros + k, mask=is_local_row)
        if HAS_DRAFTS:
            draft = tl.load(draft_tokens_ptr + src, mask=is_local_row, other=0)
        else:
            draft = zeros
        tl.store(plan.local_draft_tokens + local_row, draft, mask=is_local_row)
    for k in tl.static_range(PADDED_NUM_LOGITS_PER_REQ):
        rows = k * PADDED_NUM_REQS + reqs
        in_rows = rows < max_num_rows
        tl.store(plan.send_rows + rows, zeros, mask=in_rows & (rows >= row_offset))
        local_tail = in_rows & (rows >= local_rows)
        tl.store(plan.local_row_src + rows, zeros, mask=local_tail)
        tl.store(plan.local_row_slot + rows, zeros, mask=local_tail)
        tl.store(plan.local_row_pos + rows, zeros, mask=local_tail)
        tl.store(plan.local_draft_tokens + rows, zeros, mask=local_tail)


@triton.jit(do_not_specialize=["max_num_reqs", "max_num_rows", "gather_stride"])
def _plan_kernel(
    idx_mapping_ptr, cu_num_logits_ptr, seq_lens_ptr, num_reqs_in_ptr, draft_tokens_ptr, plan,
    max_num_reqs, max_num_rows, gather_stride, TP_SIZE: tl.constexpr, TP_RANK: tl.constexpr,
    PADDED_NUM_REQS: tl.constexpr, PADDED_NUM_LOGITS_PER_REQ: tl.constexpr,
    HAS_DRAFTS: tl.constexpr,
):
    _plan_body(idx_mapping_ptr, cu_num_logits_ptr, seq_lens_ptr, num_reqs_in_ptr, draft_tokens_ptr,
               plan, max_num_reqs, max_num_rows, gather_stride, TP_SIZE, TP_RANK, PADDED_NUM_REQS,
               PADDED_NUM_LOGITS_PER_REQ, HAS_DRAFTS)


@triton.jit(do_not_specialize=["max_num_reqs", "max_num_rows", "gather_stride"])
def _fetch_plan_kernel(
    staged,  # Staging.fetch_args(): fixed for the engine's life (a tuple's ints are specialised)
    idx_mapping_ptr, cu_num_logits_ptr, seq_lens_ptr, num_reqs_in_ptr,  # views of meta
    draft_tokens_ptr, plan, max_num_reqs, max_num_rows, gather_stride, TP_SIZE: tl.constexpr,
    TP_RANK: tl.constexpr, PADDED_NUM_REQS: tl.constexpr,
    PADDED_NUM_LOGITS_PER_REQ: tl.constexpr, HAS_DRAFTS: tl.constexpr,
    FETCH_BLOCK: tl.constexpr,
):
    rows_ptr, meta_ptr, last_ptr, staged_max_reqs = staged
    fetch_row(rows_ptr, meta_ptr, last_ptr, staged_max_reqs, 0, FETCH_BLOCK, FETCH_BLOCK)
    # The plan reads meta words other threads of this program just stored: a block-wide
    # barrier orders those global stores before its loads.
    tl.debug_barrier()
    _plan_body(idx_mapping_ptr, cu_num_logits_ptr, seq_lens_ptr, num_reqs_in_ptr, draft_tokens_ptr,
               plan, max_num_reqs, max_num_rows, gather_stride, TP_SIZE, TP_RANK, PADDED_NUM_REQS,
               PADDED_NUM_LOGITS_PER_REQ, HAS_DRAFTS)


def _check_plan_args(out: PlanBuffers, *, idx_mapping, cu_num_logits, seq_lens, num_reqs,
                     tp_rank: int, gather_stride: int, max_num_logits_per_req: int,
                     draft_token_ids) -> None:
    tp_size, max_reqs = out.tp_size, out.max_num_reqs
    max_rows = out.send_rows.shape[0]
    if max_rows != max_reqs * max_num_logits_per_req:
        raise ValueError(f"plan buffers hold {max_rows} rows, expected "
                         f"{max_reqs} * {max_num_logits_per_req}")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} out of range for tp_size {tp_size}")
    if gather_stride < 1:
        raise ValueError(f"gather_stride must be >= 1, got {gather_stride}")
    device = out.num_reqs.device
    check_int32_vector("idx_mapping", idx_mapping, max_reqs, device)
    check_int32_vector("cu_num_logits", cu_num_logits, max_reqs + 1, device)
    check_int32_vector("seq_lens", seq_lens, max_reqs, device)
    check_int32_vector("num_reqs", num_reqs, 1, device)
    if draft_token_ids is not None:
        check_int32_vector("draft_token_ids", draft_token_ids, max_rows, device)


def _plan_launch_args(out: PlanBuffers, *, tp_rank: int, gather_stride: int,
                      max_num_logits_per_req: int, draft_token_ids) -> tuple[tuple, dict]:
    """Arguments after the four inputs (drafts, outputs, sizes) and the constexprs."""
    max_reqs, max_rows = out.max_num_reqs, out.send_rows.shape[0]
    padded_reqs = triton.next_power_of_2(max_reqs)
    args = (draft_token_ids if draft_token_ids is not None else out.local_draft_tokens, out,
            max_reqs, max_rows, gather_stride)
    constexprs = dict(TP_SIZE=out.tp_size, TP_RANK=tp_rank, PADDED_NUM_REQS=padded_reqs,
                      PADDED_NUM_LOGITS_PER_REQ=triton.next_power_of_2(max_num_logits_per_req),
                      HAS_DRAFTS=draft_token_ids is not None,
                      num_warps=max(1, min(8, padded_reqs // 128)))
    return args, constexprs


def plan(
    out: PlanBuffers,
    *,
    idx_mapping: torch.Tensor,
    cu_num_logits: torch.Tensor,
    seq_lens: torch.Tensor,
    num_reqs: torch.Tensor,
    tp_rank: int,
    gather_stride: int,
    max_num_logits_per_req: int,
    draft_token_ids: torch.Tensor | None = None,
) -> PlanBuffers:
    """Build the plan for rank `tp_rank` into `out`. Graph-safe: reads n from `num_reqs` [1]."""
    inputs = dict(idx_mapping=idx_mapping, cu_num_logits=cu_num_logits, seq_lens=seq_lens,
                  num_reqs=num_reqs)
    options = dict(tp_rank=tp_rank, gather_stride=gather_stride,
                   max_num_logits_per_req=max_num_logits_per_req, draft_token_ids=draft_token_ids)
    _check_plan_args(out, **inputs, **options)
    args, constexprs = _plan_launch_args(out, **options)
    launch(_plan_kernel, (1,), idx_mapping, cu_num_logits, seq_lens, num_reqs, *args, **constexprs)
    return out


def fetch_and_plan(staging: Staging, out: PlanBuffers, *, tp_rank: int, gather_stride: int,
                   max_num_logits_per_req: int, draft_token_ids: torch.Tensor | None = None,
                   max_reqs: int | None = None) -> PlanBuffers:
    """`staging.fetch(max_reqs)` then `plan(out, ...)` from the fetched inputs, in one launch
    (one program): a step of at most `max_reqs` requests (default: the staging's maximum).
    Graph-safe: which staged row to take is decided on the device."""
    num_reqs, _, idx_mapping, cu_num_logits, seq_lens = staging.views()
    options = dict(tp_rank=tp_rank, gather_stride=gather_stride,
                   max_num_logits_per_req=max_num_logits_per_req, draft_token_ids=draft_token_ids)
    _check_plan_args(out, idx_mapping=idx_mapping, cu_num_logits=cu_num_logits,
                     seq_lens=seq_lens, num_reqs=num_reqs, **options)
    args, constexprs = _plan_launch_args(out, **options)
    staging.pull(max_reqs)
    staged = staging.fetch_args()
    launch(_fetch_plan_kernel, (1,), staged, idx_mapping, cu_num_logits, seq_lens, num_reqs,
           *args, FETCH_BLOCK=min(_MAX_FETCH_BLOCK, triton.next_power_of_2(3 * staged[3] + 1)),
           **constexprs)
    return out
