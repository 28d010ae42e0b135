"""Debug mode `check_agreement`: prove every rank is about to run the same step.

The sharded step is only correct when every rank passes identical replicated inputs and holds
identical slot tables; a rank that diverges (a scheduler bug, a missed `add_request`) would pair
its collectives with the wrong rows and return wrong tokens without any error. With the mode on,
each step hashes what must agree and all-gathers [step, batch hash, slot-table hash, tensor
check] (32 bytes per rank) before any other collective; any difference raises on every rank.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from graphshard.errors import InvalidBatchError, RankDivergenceError
from graphshard.transports.base import all_gather_single, finish

__all__ = ["AgreementCheck", "RankDivergenceError", "SlotDigest", "digest"]


def digest(*parts) -> int:
    """A 63-bit hash of NumPy arrays and plain values (order and dtype sensitive)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(p.tobytes() if isinstance(p, np.ndarray) else repr(p).encode())
        h.update(b"|")
    return int.from_bytes(h.digest(), "little") >> 1


class SlotDigest:
    """XOR of per-slot hashes of (slot, params) over the active slots: O(1) per change, and equal
    on two ranks exactly when they hold the same requests with the same parameters (bar
    collisions), whatever order the calls came in."""

    def __init__(self, max_num_slots: int):
        self._hashes = np.zeros(max_num_slots, dtype=np.int64)
        self.value = 0

    def set(self, slot: int, params) -> None:
        self._replace(slot, digest(int(slot), params))

    def remove(self, slot: int) -> None:
        self._replace(slot, 0)

    def _replace(self, slot: int, h: int) -> None:
        self.value ^= int(self._hashes[slot]) ^ h
        self._hashes[slot] = h


class AgreementCheck:
    """One all-gather per step; raises the same error on every rank when anything differs."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int, device: torch.device,
                 timeout_s: float):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.device = device if device.type == "cuda" else torch.device("cpu")
        self._timeout = timedelta(seconds=timeout_s)
        self._mine = torch.zeros(4, dtype=torch.int64, device=self.device)
        self._all = torch.zeros(world_size * 4, dtype=torch.int64, device=self.device)  # [T * 4]

    def check(self, step: int, batch: int, slots: int, replicated_error: Exception | None,
              local_error: Exception | None, wait=None) -> None:
        """`batch` hashes the replicated inputs (or the error refusing them), `slots` the slot
        tables. `wait(step, event)` bounds the wait for the gather on CUDA."""
        flags = int(local_error is not None) + 2 * int(replicated_error is not None)
        self._mine.copy_(torch.tensor([step, batch, slots, flags]))
        finish(all_gather_single(self._all, self._mine, group=self.group, async_op=True),
               self.device, self._timeout)
        if self.device.type == "cuda" and wait is not None:
            done = torch.cuda.Event()
            done.record()
            wait(step, done)
        rows = self._all.cpu().numpy().reshape(self.world_size, 4)
        if rows[:, 3].any():
            self._raise_refusals(step, rows, replicated_error, local_error)
        for col, what in ((0, "step counts"), (1, "replicated step inputs"),
                          (2, "active requests and their sampling parameters")):
            differ = np.flatnonzero(rows[:, col] != rows[0, col])
            if differ.size:
                raise RankDivergenceError(
                    f"step {step}: ranks {differ.tolist()} differ from rank 0 in their {what}; "
                    "every rank must make identical calls")

    def _raise_refusals(self, step: int, rows: np.ndarray, replicated_error, local_error):
        """Some rank refused something: the same error on every rank. The object gather below
        runs only on this error path, and is bounded by the group's own timeout alone."""
        if (rows[:, 3] == 2).all() and (rows[:, 1] == rows[0, 1]).all():
            raise replicated_error  # every rank refused the same batch the same way
        error = replicated_error if replicated_error is not None else local_error
        messages = [None] * self.world_size
        mine = f"{type(error).__name__}: {error}" if error is not None else None
        dist.all_gather_object(messages, mine, group=self.group)
        bad = "; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None)
        if (rows[:, 3] & 2).any():
            raise RankDivergenceError(f"step {step}: only some ranks refused the batch ({bad}); "
                                      "every rank must make identical calls")
        raise InvalidBatchError(f"step tensors refused on some ranks ({bad})")
