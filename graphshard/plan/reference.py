"""NumPy reference of the plan: the same pure function as the Triton plan kernel, written plainly.

Ownership is `owner(i) = idx_mapping[i] % tp_size`. Owner-sorted order is a stable sort of the
requests by owner. Every field is a function of replicated inputs only, so all ranks agree.
"""

from __future__ import annotations

import numpy as np

from graphshard.plan.layout import PLAN_FIELDS, owner_ranks, plan_shapes


def plan_ref(
    idx_mapping: np.ndarray,
    cu_num_logits: np.ndarray,
    seq_lens: np.ndarray,
    *,
    tp_size: int,
    tp_rank: int,
    max_num_reqs: int,
    max_num_logits_per_req: int,
    gather_stride: int,
    draft_token_ids: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Return every plan field (int32 arrays at their padded shapes, padding as the kernel writes it)."""
    n = int(idx_mapping.shape[0])
    out = {name: np.zeros(shape, dtype=np.int32)
           for name, shape in plan_shapes(max_num_reqs, max_num_logits_per_req, tp_size).items()}
    cu = cu_num_logits.astype(np.int64)
    m = np.diff(cu)
    owner = owner_ranks(idx_mapping, tp_size)

    out["num_reqs"][0] = n
    out["owner_num_reqs"][:] = np.bincount(owner, minlength=tp_size)
    out["owner_num_rows"][:] = np.bincount(owner, weights=m, minlength=tp_size).astype(np.int64)
    out["owner_req_offsets"][1:] = np.cumsum(out["owner_num_reqs"])
    out["owner_row_offsets"][1:] = np.cumsum(out["owner_num_rows"])

    order = np.argsort(owner, kind="stable")  # owner-sorted request order
    send_rows = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in order]) if n else np.zeros(0)
    out["send_rows"][:send_rows.shape[0]] = send_rows

    rank_in_owner = np.zeros(n, dtype=np.int64)
    for d in range(tp_size):
        mine = np.flatnonzero(owner == d)
        rank_in_owner[mine] = np.arange(mine.shape[0])
    out["gathered_src_indices"][:n] = owner * gather_stride + rank_in_owner

    local = np.flatnonzero(owner == tp_rank)
    nl = local.shape[0]
    local_m = m[local]
    local_rows = int(local_m.sum())
    out["local_num_reqs"][0] = nl
    out["local_num_rows"][0] = local_rows
    out["local_req_indices"][:nl] = local
    out["local_idx_mapping"][:nl] = idx_mapping[local]
    out["local_seq_lens"][:nl] = seq_lens[local]
    out["local_cu_num_logits"][1:nl + 1] = np.cumsum(local_m)
    out["local_cu_num_logits"][nl + 1:] = local_rows
    if nl:
        src = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in local])
        out["local_row_src"][:local_rows] = src
        out["local_row_slot"][:local_rows] = np.repeat(idx_mapping[local], local_m)
        out["local_row_pos"][:local_rows] = np.concatenate([np.arange(k) for k in local_m])
        if draft_token_ids is not None:
            out["local_draft_tokens"][:local_rows] = draft_token_ids[src]
    assert set(out) == set(PLAN_FIELDS)
    return out
