"""Host-side checks of the replicated step inputs.

They run on every rank over identical inputs before any collective or device work, so a bad
batch raises the same error everywhere, nothing hangs and no engine state changes.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch

from graphshard.errors import InvalidBatchError, InvalidTypeError, shown

__all__ = ["BatchChecker", "BatchLimits", "InvalidBatchError", "to_host_int32", "validate_batch"]


@dataclass(frozen=True)
class BatchLimits:
    max_num_reqs: int
    max_num_logits_per_req: int
    max_num_slots: int


def to_host_int32(name: str, value) -> np.ndarray:
    """A 1-D host int32 array from a NumPy array, list or CPU tensor; anything else is refused."""
    if type(value) is np.ndarray and value.dtype == np.int32 and value.ndim == 1:
        return value  # the hot path: the scheduler's own arrays
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise InvalidBatchError(
                f"{name} must be a host array (the scheduler's copy), got a tensor on {value.device}")
        # Refused before .numpy(), which fails with torch's own errors on bfloat16 and on
        # tensors that require grad.
        if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise InvalidTypeError(f"{name} must hold integers, got dtype {value.dtype}")
        try:
            value = value.numpy()
        except (TypeError, RuntimeError) as e:
            raise InvalidBatchError(f"{name}: cannot read this tensor on the host ({e})") from None
    elif isinstance(value, np.ma.MaskedArray):
        # np.asarray would drop the mask and read the masked-out values.
        if np.ma.getmaskarray(value).any():
            raise InvalidBatchError(f"{name} has masked entries")
        value = value.data
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged nested lists, objects NumPy cannot convert
        raise InvalidBatchError(
            f"{name} must be a 1-D integer array, got {type(value).__name__}: {e}") from None
    if arr.ndim != 1:
        raise InvalidBatchError(f"{name} must be 1-D (an integer array, list or CPU tensor), got "
                                f"{type(value).__name__} of shape {arr.shape}")
    if isinstance(value, (list, tuple)) and arr.dtype != np.bool_:
        # NumPy reads a bool among ints as 0 or 1; an all-bool list is refused by dtype below.
        for i, v in enumerate(value):
            if _is_bool(v):
                raise InvalidTypeError(f"{name} must hold integers, got bool {v!r} at position {i}")
    if arr.dtype == object:
        return _object_to_int32(name, arr)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidTypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < np.iinfo(np.int32).min or arr.max() > np.iinfo(np.int32).max):
        raise InvalidBatchError(f"{name} has values outside int32")
    return arr.astype(np.int32, copy=False)


def _is_bool(v) -> bool:
    """A Python or NumPy bool, or a bool 0-d array or tensor (each converts to 0 or 1)."""
    if isinstance(v, np.ndarray):
        return v.dtype == np.bool_
    if isinstance(v, torch.Tensor):
        return v.dtype is torch.bool
    return isinstance(v, (bool, np.bool_))


def _object_to_int32(name: str, arr: np.ndarray) -> np.ndarray:
    """An object array (NumPy's fallback for Python ints beyond 64 bits, or built with
    dtype=object) as int32: every entry a non-bool integer within int32, converted exactly."""
    values = []
    for i, v in enumerate(arr):
        if _is_bool(v) or not isinstance(v, numbers.Integral):
            raise InvalidTypeError(f"{name} must hold integers, got {type(v).__name__} {shown(v)} "
                                   f"at position {i} (dtype object)")
        values.append(int(v))
    lo, hi = np.iinfo(np.int32).min, np.iinfo(np.int32).max
    if any(not lo <= v <= hi for v in values):
        raise InvalidBatchError(f"{name} has values outside int32")
    return np.array(values, dtype=np.int32)


_INT32 = np.dtype(np.int32)
# Up to this batch size a Python set checks slots faster than NumPy's scatter and gather (about
# 2 us at 32 either way on the 2-core CI machine; the set grows ~50 ns per slot).
_SET_CHECK_MAX = 32
# Up to this batch size a Python loop checks cu_num_logits' row counts instead of NumPy's
# subtract and max. Called back to back on the 2-core CPU machine the loop takes ~35 ns a request
# (4.6 µs at 128) and NumPy ~3 µs; cold, in a decode loop, NumPy's calls cost far more (below).
_LOOP_CHECK_MAX = 128


class BatchChecker:
    """Checks each step's replicated inputs and tracks which slots hold a request.

    `check` first tries a cheap test that only ever accepts valid batches (the step's host budget
    is microseconds): NumPy int32 arrays, the batch's slots equal to the last accepted ones while
    no request came or went, or else a set test; byte tests for cu_num_logits and seq_lens. Any
    doubt goes to the exact checks, which name the first mistake: the errors are theirs alone."""

    def __init__(self, limits: BatchLimits):
        self.limits = limits
        self.active = np.zeros(limits.max_num_slots, dtype=bool)
        self._active_set: set[int] = set()
        # slot -> itself while it holds a request, else the sentinel max_num_slots (its own entry).
        # Index-typed, so the scatter and gather it feeds convert nothing (half their cost).
        self._slot_map = np.full(limits.max_num_slots + 1, limits.max_num_slots, dtype=np.intp)
        self._scratch = np.zeros(limits.max_num_slots + 1, dtype=np.int32)
        self._positions = np.arange(limits.max_num_reqs, dtype=np.int32)
        self._position_bytes = self._positions.tobytes()
        # cu_num_logits of one row per request: 0..n, compared as bytes.
        self._unit_cu = np.arange(limits.max_num_reqs + 1, dtype=np.int32).tobytes()
        self._changes = 0  # bumped by every add or remove: the slot cache below is stale then
        self._last_slots: bytes | None = None
        self._last_slots_at = -1
        self._last_cu: bytes | None = None

    # -- slot tracking ------------------------------------------------------------------------
    def activate(self, slot: int) -> None:
        self.active[slot] = True
        self._active_set.add(int(slot))
        self._slot_map[slot] = slot
        self._changes += 1

    def deactivate(self, slot: int) -> None:
        self.active[slot] = False
        self._active_set.discard(int(slot))
        self._slot_map[slot] = self.limits.max_num_slots
        self._changes += 1

    # -- checks -------------------------------------------------------------------------------
    def check(self, idx_mapping, cu_num_logits, seq_lens, *, require_active: bool = True):
        """Return the inputs as host int32 arrays, or raise InvalidBatchError saying what is wrong."""
        if require_active and self.accepts(idx_mapping, cu_num_logits, seq_lens):
            return idx_mapping, cu_num_logits, seq_lens
        return self.check_exactly(idx_mapping, cu_num_logits, seq_lens, require_active=require_active)

    def accepts(self, idx, cu, lens) -> bool:
        """True only for a batch `check_exactly` accepts unchanged (False: ask it)."""
        nd = np.ndarray
        if type(idx) is not nd or type(cu) is not nd or type(lens) is not nd:
            return False
        if idx.dtype is not _INT32 or cu.dtype is not _INT32 or lens.dtype is not _INT32:
            return False
        if idx.ndim != 1 or cu.ndim != 1 or lens.ndim != 1:
            return False
        n = idx.shape[0]
        if n > self.limits.max_num_reqs or cu.shape[0] != n + 1 or lens.shape[0] != n:
            return False
        # seq_lens >= 0: no word's top byte has its sign bit set (little-endian words).
        if not lens.tobytes()[3::4].isascii():
            return False
        return self._cu_fits(cu, n) and self._slots_fit(idx, n)

    def _cu_fits(self, cu: np.ndarray, n: int) -> bool:
        m = self.limits.max_num_logits_per_req
        cu_bytes = cu.tobytes()
        if cu_bytes == self._unit_cu[:4 * (n + 1)]:
            return True  # every request has one row
        if m == 1 or cu_bytes[:4] != b"\0\0\0\0":  # cu[0] != 0
            return False
        if cu_bytes == self._last_cu:
            return True
        if n <= _LOOP_CHECK_MAX:
            # Python ints: nothing wraps. In a decode loop this runs cold, where each NumPy call
            # costs microseconds (in the mixed workload's loop on the 2-core CPU machine, this
            # function's p50 went from 31-59 to 9-11 µs).
            prev = 0
            for edge in cu.tolist()[1:]:
                if not 0 < edge - prev <= m:
                    return False
                prev = edge
        else:
            # From cu[0] = 0 and rows in [1, m] so far, entries stay small: an int32 difference
            # cannot wrap into [1, m] (see check_exactly).
            rows_minus_one = (cu[1:] - cu[:-1] - 1).view(np.uint32)
            if rows_minus_one.max() >= m:
                return False
        self._last_cu = cu_bytes
        return True

    def _slots_fit(self, idx: np.ndarray, n: int) -> bool:
        """Slots in range, distinct and holding a request."""
        slots = idx.tobytes()
        if slots == self._last_slots and self._last_slots_at == self._changes:
            return True
        if n <= _SET_CHECK_MAX:
            # Active slots are in range (add_request checks): one subset test covers both.
            distinct = set(idx.tolist())
            ok = len(distinct) == n and distinct <= self._active_set
        else:
            ok = self._slots_fit_vectorised(idx, n)
        if ok:
            self._last_slots, self._last_slots_at = slots, self._changes
        return ok

    def _slots_fit_vectorised(self, idx: np.ndarray, n: int) -> bool:
        # Slots out of range (negative ones too, as uint32) or without a request all map to the
        # sentinel entry. Write each request's position at its mapped slot, poison the sentinel,
        # read back: only distinct active slots read their own position.
        sentinel = self.limits.max_num_slots
        mapped = self._slot_map.take(idx.view(np.uint32), mode="clip")
        self._scratch[mapped] = self._positions[:n]
        self._scratch[sentinel] = -1
        return self._scratch.take(mapped).tobytes() == self._position_bytes[:4 * n]

    def check_exactly(self, idx_mapping, cu_num_logits, seq_lens, *, require_active: bool = True):
        """Every check, in the contract's order: the first mistake raises, naming itself."""
        lim = self.limits
        idx = to_host_int32("idx_mapping", idx_mapping)
        cu = to_host_int32("cu_num_logits", cu_num_logits)
        lens = to_host_int32("seq_lens", seq_lens)
        n = idx.shape[0]
        if n > lim.max_num_reqs:
            raise InvalidBatchError(f"batch of {n} requests exceeds max_num_reqs ({lim.max_num_reqs})")
        if cu.shape[0] != n + 1:
            raise InvalidBatchError(f"cu_num_logits must have n+1 = {n + 1} entries, got {cu.shape[0]}")
        if lens.shape[0] != n:
            raise InvalidBatchError(f"seq_lens must have n = {n} entries, got {lens.shape[0]}")
        if cu[0] != 0:
            raise InvalidBatchError(f"cu_num_logits must start at 0, got {cu[0]}")
        if n == 0:
            return idx, cu, lens
        # From cu[0] = 0, legal steps keep every entry small, so int32 differences cannot wrap
        # before the first illegal step; that one may wrap, but only to a value near 2**31, which
        # is still caught. The message recomputes the counts exactly.
        counts = cu[1:] - cu[:-1]
        if counts.min() < 1 or counts.max() > lim.max_num_logits_per_req:
            self._raise_counts(cu)
        # Negative slots turn huge as uint32: one comparison checks both ends.
        if idx.view(np.uint32).max() >= lim.max_num_slots:
            bad = idx[(idx < 0) | (idx >= lim.max_num_slots)][0]
            raise InvalidBatchError(f"slot {bad} in idx_mapping is out of range [0, {lim.max_num_slots})")
        # Write each request's position at its slot and read it back: a repeated slot keeps only
        # the last writer, so an earlier request reads a position that is not its own.
        pos = self._positions[:n]
        self._scratch[idx] = pos
        if not np.array_equal(self._scratch[idx], pos):
            values, hits = np.unique(idx, return_counts=True)
            raise InvalidBatchError(f"slot {values[hits > 1][0]} appears more than once in idx_mapping")
        if require_active and not self.active[idx].all():
            bad = idx[~self.active[idx]][0]
            raise InvalidBatchError(f"slot {bad} holds no request; call add_request first")
        if lens.min() < 0:
            raise InvalidBatchError(f"seq_lens must be >= 0, got {lens.min()}")
        return idx, cu, lens

    def _raise_counts(self, cu: np.ndarray):
        # The first bad request, with its exact (int64) count: a later one is often only the
        # echo of an earlier mistake.
        counts = np.diff(cu.astype(np.int64))
        i = int(np.flatnonzero((counts < 1) | (counts > self.limits.max_num_logits_per_req))[0])
        if counts[i] < 1:
            raise InvalidBatchError(
                f"cu_num_logits must be strictly increasing (every request has >= 1 logits row); "
                f"request {i} has {counts[i]}")
        raise InvalidBatchError(
            f"request {i} has {counts[i]} logits rows, above max_num_logits_per_req "
            f"({self.limits.max_num_logits_per_req})")


def validate_batch(idx_mapping, cu_num_logits, seq_lens, limits: BatchLimits):
    """Check replicated inputs without slot tracking; return them as host int32 arrays."""
    return BatchChecker(limits).check(idx_mapping, cu_num_logits, seq_lens, require_active=False)
