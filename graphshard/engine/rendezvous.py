"""A bounded meeting of every rank through the group's c10d store, before a collective call.

`capture()` runs collectives; called on some ranks only, they would pair with whatever the other
ranks run next (a step's collectives of other sizes, say) and gloo or NCCL would abort the
process. Meeting in the store first, with a deadline, turns that into one clear error on every
rank that called it, while no collective has run yet.

The meeting is one store key holding the set of ranks that arrived ("0,2"), changed only by
compare-and-set, so arrivals and giving up are ordered: once every rank is in the set it never
becomes "gone"; once a rank that waited too long wrote "gone:<ranks that came>", no later
arrival gets in, and every rank that came raises naming the ranks that did not.
"""

from __future__ import annotations

import time

from graphshard.errors import RankDivergenceError

_GONE = "gone:"  # followed by the ranks that had arrived


class Rendezvous:
    """Meetings of one engine's ranks. Keys are the engine's own (`prefix`), and each call of a
    meeting (`meet("capture")`) counts its attempts, the same on every rank that made them, so a
    retry after a failed meeting uses a fresh key."""

    def __init__(self, store, prefix: str | None, rank: int, world_size: int, timeout_s: float):
        self.store, self.prefix = store, prefix
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._attempts: dict[str, int] = {}

    def meet(self, what: str, timeout_s: float | None = None) -> None:
        """Return once every rank has called `meet(what)` (as often), or raise
        `RankDivergenceError` after `timeout_s` (default: the engine's), and at once on a rank
        that comes too late. Without a store (a single process, a group built without one)
        there is nothing to do."""
        if self.world_size == 1 or self.store is None or self.prefix is None:
            return
        attempt = self._attempts.get(what, 0)
        self._attempts[what] = attempt + 1
        key = f"{self.prefix}/meet/{what}/{attempt}"
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        arrived = self._arrive(key, what, timeout_s)
        delay = 0.001
        while len(arrived) < self.world_size:
            if time.monotonic() > deadline:
                gone = _GONE + _joined(arrived)
                arrived = self._parse(self.store.compare_set(key, _joined(arrived), gone).decode(),
                                      what, timeout_s)
                continue  # raised if the meeting is off; else someone arrived meanwhile
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            arrived = self._parse(self.store.get(key).decode(), what, timeout_s)

    def _arrive(self, key: str, what: str, timeout_s: float) -> set[int]:
        current = self.store.compare_set(key, "", "").decode()  # creates the key if missing
        while True:
            arrived = self._parse(current, what, timeout_s)
            desired = _joined(arrived | {self.rank})
            current = self.store.compare_set(key, current, desired).decode()
            if current == desired:  # only this rank writes a set holding its own rank
                return arrived | {self.rank}

    def _parse(self, value: str, what: str, timeout_s: float) -> set[int]:
        """The ranks that arrived, or raise if the meeting was given up."""
        if not value.startswith(_GONE):
            return _ranks(value)
        came = _ranks(value[len(_GONE):])
        if self.rank not in came:
            raise RankDivergenceError(
                f"{what}() came too late on rank {self.rank}: ranks {sorted(came)} called it and "
                f"gave up after {self._bound(timeout_s)}; every rank of the group must "
                f"call {what}() together (it runs collectives)")
        missing = sorted(set(range(self.world_size)) - came)
        raise RankDivergenceError(
            f"{what}() was called on ranks {sorted(came)} but not on ranks {missing} within "
            f"{self._bound(timeout_s)}; every rank of the group must call {what}() "
            f"(it runs collectives)")

    def _bound(self, timeout_s: float) -> str:
        return f"timeout_s = {timeout_s:g} s" if timeout_s == self.timeout_s else f"{timeout_s:g} s"


def _ranks(value: str) -> set[int]:
    return {int(r) for r in value.split(",")} if value else set()


def _joined(ranks: set[int]) -> str:
    return ",".join(str(r) for r in sorted(ranks))
