"""Host-side checks of the replicated step inputs.

They run on every rank over identical inputs before any collective or device work, so a bad
batch raises the same error everywhere, nothing hangs and no engine state changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class InvalidBatchError(ValueError):
    """The replicated inputs of a step break the contract of DESIGN section 1."""


class BatchTooLargeError(InvalidBatchError):
    """The batch exceeds the largest captured bucket and the eager fallback is off."""


@dataclass(frozen=True)
class BatchLimits:
    max_num_reqs: int
    max_num_logits_per_req: int
    max_num_slots: int


def to_host_int32(name: str, value) -> np.ndarray:
    """A 1-D host int32 array from a NumPy array, list or CPU tensor; anything else is refused."""
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise InvalidBatchError(
                f"{name} must be a host array (the scheduler's copy), got a tensor on {value.device}")
        value = value.numpy()
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InvalidBatchError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidBatchError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise InvalidBatchError(f"{name} has values outside int32")
    return arr.astype(np.int32, copy=False)


def validate_batch(idx_mapping, cu_num_logits, seq_lens, limits: BatchLimits):
    """Check the replicated inputs; return them as host int32 arrays."""
    idx = to_host_int32("idx_mapping", idx_mapping)
    cu = to_host_int32("cu_num_logits", cu_num_logits)
    lens = to_host_int32("seq_lens", seq_lens)
    n = idx.shape[0]
    if n > limits.max_num_reqs:
        raise InvalidBatchError(f"batch of {n} requests exceeds max_num_reqs ({limits.max_num_reqs})")
    if cu.shape[0] != n + 1:
        raise InvalidBatchError(f"cu_num_logits must have n+1 = {n + 1} entries, got {cu.shape[0]}")
    if lens.shape[0] != n:
        raise InvalidBatchError(f"seq_lens must have n = {n} entries, got {lens.shape[0]}")
    if cu[0] != 0:
        raise InvalidBatchError(f"cu_num_logits must start at 0, got {cu[0]}")
    counts = np.diff(cu.astype(np.int64))
    if n and counts.min() < 1:
        i = int(np.argmin(counts))
        raise InvalidBatchError(
            f"cu_num_logits must be strictly increasing (every request has >= 1 logits row); "
            f"request {i} has {counts[i]}")
    if n and counts.max() > limits.max_num_logits_per_req:
        i = int(np.argmax(counts))
        raise InvalidBatchError(
            f"request {i} has {counts[i]} logits rows, above max_num_logits_per_req "
            f"({limits.max_num_logits_per_req})")
    if n and (idx.min() < 0 or idx.max() >= limits.max_num_slots):
        bad = idx[(idx < 0) | (idx >= limits.max_num_slots)][0]
        raise InvalidBatchError(f"slot {bad} in idx_mapping is out of range [0, {limits.max_num_slots})")
    if n and np.unique(idx).shape[0] != n:
        values, hits = np.unique(idx, return_counts=True)
        raise InvalidBatchError(f"slot {values[hits > 1][0]} appears more than once in idx_mapping")
    if n and lens.min() < 0:
        raise InvalidBatchError(f"seq_lens must be >= 0, got {lens.min()}")
    return idx, cu, lens


def owner_counts(idx: np.ndarray, cu: np.ndarray, tp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Requests and logits rows per owner rank: what the host needs to pick a capacity tier."""
    owner = idx.astype(np.int64) % tp_size
    reqs = np.bincount(owner, minlength=tp_size)
    rows = np.bincount(owner, weights=np.diff(cu.astype(np.int64)), minlength=tp_size).astype(np.int64)
    return reqs, rows
