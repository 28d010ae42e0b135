"""Faults: bound every wait on a peer, name the cause, and stop a broken TP group from stepping.

What bounds what (RELIABILITY.md has the full picture):
- p2p barriers give up on their own after `timeout_s` (see `transports/p2p.py`) and say so in a
  status word the host reads without a device sync;
- gloo collectives wait at most `timeout_s` (a dead peer fails them at once);
- NCCL collectives run eagerly are watched by the group's own watchdog, but collectives replayed
  from a CUDA graph are not: the `Watchdog` thread here bounds every issued step on CUDA and
  aborts the group's communicators when one overruns, which makes NCCL's kernels return.

A rank that fails reports why through the group's store, so its peers' errors can name the cause
rather than only "timed out". Once a fault is seen the engine refuses every later step: the
peers' flags, queues and communicators are in an unknown state.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

from graphshard.errors import StepFault

logger = logging.getLogger(__name__)

_KEY_PREFIX = "graphshard/fault"
# A wait first polls the done word this long without sleeping: a step ends tens of µs after the
# host issued it, and `time.sleep(0)` may sleep up to the kernel's timer slack (50 µs on Linux),
# which made a read of a 50 µs step take 100 (one H200, BENCHMARKS.md).
SPIN_S = 0.002


def default_store():
    """The store the default group was built on (file, TCP, ...), or None where there is none."""
    try:
        return dist.distributed_c10d._get_default_store() if dist.is_initialized() else None
    except (AttributeError, RuntimeError, ValueError):
        return None


class FaultReporter:
    """Out-of-band failure reports between the ranks of one engine, through a c10d store.

    Keys carry the group name and how many engines this rank has built on that group, which is
    the same number on every rank (engines are built collectively), so reports of an earlier
    engine never show up as causes in a later one."""

    def __init__(self, store, group: dist.ProcessGroup | None, rank: int, world_size: int):
        self.store, self.rank, self.world_size = store, rank, world_size
        self.pending = False  # a report is in the store
        self._prefix = None
        if store is not None:
            name = group.group_name if group is not None else "local"
            try:
                serial = store.add(f"{_KEY_PREFIX}/{name}/engines/{rank}", 1)
                self._prefix = f"{_KEY_PREFIX}/{name}/{serial}"
            except Exception as e:  # noqa: BLE001 - reports are best-effort, faults still raise
                logger.warning("fault reports disabled: store unusable (%s)", e)

    @property
    def prefix(self) -> str | None:
        """This engine's store keys start with it (None without a usable store)."""
        return self._prefix

    def report(self, message: str) -> None:
        if self._prefix is None:
            return
        try:
            self.store.set(f"{self._prefix}/{self.rank}", message)
            self.pending = bool(message)
        except Exception as e:  # noqa: BLE001 - the store may be gone with its host rank
            logger.warning("could not report the fault to peers: %s", e)

    def clear(self) -> None:
        """Withdraw a report (a refused step every rank refused), so a later fault elsewhere is
        not blamed on it. Costs one store write, only after a report."""
        if self.pending:
            self.report("")

    def peer_reports(self) -> dict[int, str]:
        """What the other ranks reported (ranks that reported nothing are absent)."""
        if self._prefix is None:
            return {}
        out = {}
        for r in range(self.world_size):
            key = f"{self._prefix}/{r}"
            try:
                if r != self.rank and self.store.check([key]):
                    message = self.store.get(key).decode(errors="replace")
                    if message:
                        out[r] = message
            except Exception:  # noqa: BLE001 - a store that died with its host has nothing to say
                break
        return out


def _spin(done: np.ndarray, step: int, limit_s: float) -> bool:
    """Poll `done` until it reaches `step` (True) or `limit_s` has passed (False)."""
    end = time.perf_counter() + limit_s
    while done[0] < step:
        for _ in range(64):  # a word load each: ~0.1 µs
            if done[0] >= step:
                return True
        if time.perf_counter() > end:
            return False
    return True


class StepClock:
    """The engine's steps in flight on the device: when each of the last two was issued, and the
    last one finished (`done`, a pinned word the step's last kernel writes). Reading it costs a
    NumPy load where an event per step would cost a record and a query."""

    def __init__(self, done: np.ndarray):
        self.done = done  # int64 [1]
        self.issued = -1
        self.issued_at = [0.0, 0.0]  # by step parity: at most two steps are in flight

    def start(self, step: int) -> None:
        self.issued_at[step & 1] = time.monotonic()
        self.issued = step  # after its time: a reader that sees the step sees its time

    def overdue(self, limit_s: float) -> int | None:
        """The oldest unfinished step if it has run past `limit_s` since its issue, else None.
        Safe from another thread: a stale `done` only ever pairs a step with a later issue time."""
        oldest = int(self.done[0]) + 1
        if oldest > self.issued:
            return None
        return oldest if time.monotonic() - self.issued_at[oldest & 1] > limit_s else None


class FaultGuard:
    """One engine's fault state: bounded waits on its issued steps, reports to and from the peers,
    and the fault that, once seen, every later step raises. `step` numbers are the engine's.

    On CUDA a step runs after `step()` returns: `done` (see `StepClock`) says which finished.
    Elsewhere every step runs inside the call (`synchronous`)."""

    def __init__(self, *, group: dist.ProcessGroup | None, rank: int, world_size: int,
                 device: torch.device, timeout_s: float, transport=None, done: np.ndarray | None = None):
        multi = world_size > 1
        self.rank, self.transport = rank, transport
        self.reporter = FaultReporter(default_store() if multi else None, group, rank, world_size)
        self.synchronous = device.type != "cuda"
        self.clock = StepClock(done) if not self.synchronous and done is not None else None
        # Only CUDA steps run after the call returns; elsewhere every wait is bounded in the step.
        self.watchdog = Watchdog(group, 2 * timeout_s, self.clock) \
            if multi and device.type == "cuda" else None
        self._transport_fault = transport.fault if transport is not None else _no_fault
        self.fault: str | None = None

    def check_standing(self) -> None:
        if self.fault is not None:
            raise StepFault(f"the engine is broken by an earlier fault: {self.fault}")

    def admit(self, step: int) -> None:
        """Step `step` passed its checks and is about to be staged: withdraw an earlier refusal
        report (every rank refused it: the group went on), wait (bounded) until step - 2 has
        finished (its staging row is this step's), raise a fault seen since, start its clock."""
        if self.reporter.pending:
            self.reporter.clear()
        clock = self.clock
        if clock is None:
            return
        if clock.done[0] < step - 2:
            self._wait(step - 2)
        watchdog = self.watchdog
        if watchdog is not None and watchdog.fault is not None:
            self.fail(step - 1, watchdog.fault)
        fault = self._transport_fault()
        if fault is not None:
            self.fail(step - 1, fault)
        clock.start(step)

    def ran(self, step: int) -> None:
        """A synchronous step returned: raise what it ran into."""
        self._check_transport(step)

    def abandon(self, step: int) -> None:
        """Step `step` raised while being issued: stop timing it (the engine fails it)."""
        if self.clock is not None and self.clock.issued == step:
            self.clock.issued = step - 1

    def check(self, step: int) -> None:
        """Raise the standing fault, or wait (bounded) for step `step` to finish and raise what
        it ran into (only where a step can fail after its call returned: CUDA with peers)."""
        self.check_standing()
        if self.watchdog is None or step < 0:
            return
        if self.clock.done[0] < step:
            self._wait(step)
        if self.watchdog.fault is not None:
            self.fail(step, self.watchdog.fault)
        self._check_transport(step)

    def drain(self, step: int) -> None:
        """Wait (bounded where peers are involved) until step `step` has finished."""
        if self.clock is not None and step >= 0 and self.clock.done[0] < step:
            self._wait(step)

    def _wait(self, step: int) -> None:
        if _spin(self.clock.done, step, SPIN_S):
            return
        if self.watchdog is None:  # no peers: the step cannot hang on one
            while self.clock.done[0] < step:
                time.sleep(0)
            return
        fault = self.watchdog.wait_step(step)
        if fault is not None:
            self.fail(step, fault)

    def refused(self, step: int, error: Exception) -> None:
        """This rank refused a step's inputs: peers that went on into the step can name why."""
        self.reporter.report(f"step {step} refused: {type(error).__name__}: {error}")

    def wait_for(self, step: int, done) -> None:
        """Wait (bounded) for a CUDA event of step `step` outside the step itself (a check's
        collective), raising `StepFault` past the bound."""
        if self.watchdog is None:
            done.synchronize()
            return
        self.watchdog.watch(step, done, what="the agreement check of step")
        fault = self.watchdog.wait()
        self.watchdog.disarm()
        if fault is not None:
            self.fail(step, fault)

    def fail(self, step: int, what: str, cause: BaseException | None = None):
        """Record the fault, tell the peers and raise it; every later check raises it too."""
        self.reporter.report(f"step {step} failed: {what}")
        self.fault = describe(f"step {step} failed on rank {self.rank}: {what}",
                              self.reporter.peer_reports())
        raise StepFault(self.fault) from cause

    def give_up(self, reason: str) -> None:
        self.reporter.report(f"gave up: {reason}")
        self.fault = f"this rank gave up: {reason}"

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.close()

    def _check_transport(self, step: int) -> None:
        fault = self._transport_fault()
        if fault is not None:
            self.fail(step, fault)


def _no_fault() -> None:
    return None


def describe(what: str, reports: dict[int, str]) -> str:
    """A fault's message: the peers' reports first (the cause: a refused tensor, a rank that gave
    up), then on the next line what this rank saw (a timeout, a closed connection)."""
    if not reports:
        return f"{what}; no peer reported an error (a peer may have died or stopped stepping)"
    causes = "; ".join(f"rank {r}: {m}" for r, m in sorted(reports.items()))
    return f"{causes}\n{what}"


class Watchdog:
    """Bounds each issued CUDA step: a step still running `limit_s` after its issue aborts the
    group's communicators (NCCL kernels then return) and becomes a fault the engine raises at
    its next call. A daemon thread checks even while the caller is blocked elsewhere (reading the
    step's outputs, say); `wait` and `wait_step` check on the caller's thread.

    Two things are watched: the engine's steps through a `StepClock`, and one event at a time
    given to `watch` (a collective outside the step)."""

    def __init__(self, group: dist.ProcessGroup | None, limit_s: float, clock: StepClock | None = None):
        self.group, self.limit_s, self.clock = group, limit_s, clock
        self.fault: str | None = None
        self._step: tuple[int, float, torch.cuda.Event] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if clock is not None:
            self._start()

    def watch(self, step: int, done: torch.cuda.Event, what: str = "step") -> None:
        """`done` fires when step `step` (or `what`), issued now, has finished on the device."""
        with self._lock:
            self._step = (f"{what} {step}", time.monotonic(), done)
        self._start()

    def wait(self) -> str | None:
        """Wait for the last watched event, at most until its bound; the fault, or None."""
        current = self._step
        if current is None:
            return self.fault
        _, issued_at, done = current
        while not done.query():
            if self.fault is not None or time.monotonic() - issued_at > self.limit_s:
                return self._overrun()
            time.sleep(0)  # a GIL switch point, so the watchdog thread keeps its period
        return self.fault

    def wait_step(self, step: int) -> str | None:
        """Wait until the clock's step `step` finished, at most until its bound; the fault, or None."""
        clock = self.clock
        while clock.done[0] < step:
            if self.fault is not None or clock.overdue(self.limit_s) is not None:
                return self._overrun()
            time.sleep(0)
        return self.fault

    def disarm(self) -> None:
        with self._lock:
            self._step = None

    def close(self) -> None:
        self._stop.set()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="graphshard-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        period = min(1.0, self.limit_s / 4)
        while not self._stop.wait(period) and self.fault is None:
            try:
                self._overrun()
            except Exception as e:  # noqa: BLE001 - a sticky CUDA error, say: the caller's turn
                self.fault = f"the step watchdog stopped: {type(e).__name__}: {e}"
                logger.error("%s", self.fault)

    def _overrun(self) -> str | None:
        with self._lock:
            if self.fault is None:
                late = self._late()
                if late is not None:
                    self.fault = f"{late} did not finish within {self.limit_s:g} s of its issue"
                    logger.error("%s; aborting the group's communicators", self.fault)
                    abort_group(self.group)
            return self.fault

    def _late(self) -> str | None:
        """What has run past the bound: the watched event's step, or the clock's oldest step."""
        current = self._step
        if current is not None:
            what, issued_at, done = current
            if not done.query() and time.monotonic() - issued_at > self.limit_s:
                return what
        late = self.clock.overdue(self.limit_s) if self.clock is not None else None
        return f"step {late}" if late is not None else None


def abort_group(group: dist.ProcessGroup | None) -> None:
    """Abort the group's NCCL communicators so NCCL kernels spinning on a dead peer return.
    Backend.abort() releases the GIL and only signals the communicators, so a watchdog thread
    may call it while the main thread is blocked in a CUDA sync (destroy_process_group would
    wait for the kernels instead)."""
    if group is None:
        return
    try:
        group._get_backend(torch.device("cuda")).abort()
    except Exception as e:  # noqa: BLE001 - no NCCL backend, or nothing more can be done
        logger.error("aborting the group's communicators failed: %s", e)
