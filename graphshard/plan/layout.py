"""The plan's buffers: names, padded shapes and meaning, shared by the kernel and its reference.

N = max_num_reqs, R = N * max_num_logits_per_req, T = tp_size. Every field is int32. Entries
past the live counts hold safe values: 0 for indices and slots, and the local row count for
the tail of `local_cu_num_logits` (so it stays non-decreasing).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

PLAN_DOC = {
    "num_reqs": "[1] n, the live batch size",
    "owner_num_reqs": "[T] requests owned by each destination",
    "owner_num_rows": "[T] logits rows owned by each destination",
    "owner_req_offsets": "[T+1] exclusive prefix sum of owner_num_reqs (owner-sorted order)",
    "owner_row_offsets": "[T+1] exclusive prefix sum of owner_num_rows (send order)",
    "send_rows": "[R] owner-sorted list of batch logits rows: the send order of the exchange",
    "gathered_src_indices": "[N] batch request i -> owner(i) * gather_stride + its rank within owner",
    "local_num_reqs": "[1] requests this rank owns",
    "local_num_rows": "[1] logits rows this rank owns",
    "local_req_indices": "[N] batch index of each local request",
    "local_idx_mapping": "[N] slot of each local request",
    "local_cu_num_logits": "[N+1] prefix sums of local rows per local request",
    "local_seq_lens": "[N] seq_len of each local request",
    "local_row_src": "[R] batch logits row of each local row (draft and bitmask row map)",
    "local_row_slot": "[R] slot of each local row",
    "local_row_pos": "[R] position of each local row within its request",
    "local_draft_tokens": "[R] draft token of each local row (0 without drafts)",
}
PLAN_FIELDS = tuple(PLAN_DOC)


def owner_ranks(slots: np.ndarray, tp_size: int) -> np.ndarray:
    """The ownership rule: the rank that samples a request is its slot modulo tp_size (int64).
    The plan kernel applies the same rule on the device."""
    return np.asarray(slots).astype(np.int64) % tp_size


def owner_counts(slots: np.ndarray, cu_num_logits: np.ndarray,
                 tp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Requests and logits rows each rank owns ([tp_size] int64 each)."""
    owner = owner_ranks(slots, tp_size)
    rows = np.diff(np.asarray(cu_num_logits).astype(np.int64))
    return (np.bincount(owner, minlength=tp_size),
            np.bincount(owner, weights=rows, minlength=tp_size).astype(np.int64))


def plan_shapes(max_num_reqs: int, max_num_logits_per_req: int, tp_size: int) -> dict[str, tuple[int]]:
    n, r, t = max_num_reqs, max_num_reqs * max_num_logits_per_req, tp_size
    size = {"1": 1, "T": t, "T+1": t + 1, "N": n, "N+1": n + 1, "R": r}
    return {name: (size[doc[1:doc.index("]")]],) for name, doc in PLAN_DOC.items()}


class PlanBuffers(NamedTuple):
    """Device tensors the plan kernel writes, allocated once at the padded maximum. A NamedTuple:
    the kernels take it as one argument."""

    num_reqs: torch.Tensor
    owner_num_reqs: torch.Tensor
    owner_num_rows: torch.Tensor
    owner_req_offsets: torch.Tensor
    owner_row_offsets: torch.Tensor
    send_rows: torch.Tensor
    gathered_src_indices: torch.Tensor
    local_num_reqs: torch.Tensor
    local_num_rows: torch.Tensor
    local_req_indices: torch.Tensor
    local_idx_mapping: torch.Tensor
    local_cu_num_logits: torch.Tensor
    local_seq_lens: torch.Tensor
    local_row_src: torch.Tensor
    local_row_slot: torch.Tensor
    local_row_pos: torch.Tensor
    local_draft_tokens: torch.Tensor

    @classmethod
    def allocate(cls, max_num_reqs: int, max_num_logits_per_req: int, tp_size: int,
                 device: torch.device | str) -> "PlanBuffers":
        shapes = plan_shapes(max_num_reqs, max_num_logits_per_req, tp_size)
        return cls(**{name: torch.zeros(shape, dtype=torch.int32, device=device)
                      for name, shape in shapes.items()})

    @property
    def tp_size(self) -> int:
        return self.owner_num_reqs.shape[0]

    @property
    def max_num_reqs(self) -> int:
        return self.local_idx_mapping.shape[0]

    def as_dict(self) -> dict[str, torch.Tensor]:
        return self._asdict()


assert PlanBuffers._fields == PLAN_FIELDS
