"""The p2p transport's device-side barrier (`graphshard.transports.p2p` gives the protocol and
why it keeps the signal pads consistent): `sync` raises this program's flag on every rank's pad
and waits, bounded by a timeout, for every rank's flag on its own pad, consuming it. A wait that
gives up records (phase, peer) in the status word and its pinned host copy; later waits read the
word and give up at once.

On CPU the same functions run under the Triton interpreter (shared-file pads across processes):
the clock is the host's and a spinning rank sleeps between polls.
"""

from __future__ import annotations

import os
import time

import triton
import triton.language as tl

if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def _clock_ns():
        return time.monotonic_ns()  # the interpreter has no %globaltimer

    @triton.jit
    def _spin_pause():
        # Interpreted ranks share a few CPU cores: a rank spinning flat out starves the peer it
        # waits for.
        time.sleep(20e-6)
else:
    @triton.jit
    def _spin_pause():
        pass

    @triton.jit
    def _clock_ns():
        """%globaltimer as one value for the whole program. Warps read the clock at different
        times; the max over a tensor that spans every thread is reduced through shared memory,
        so each thread gets the same value (1024 lanes: at least one per thread)."""
        lanes = tl.arange(0, 1024)
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lanes],
                                        dtype=tl.int64, is_pure=False, pack=1)
        return tl.max(now, axis=0)


@triton.jit
def _arrive(signal_ptrs_ptr, slot, rank, WORLD_SIZE: tl.constexpr):
    """Raise this rank's flag for `slot` on every rank's pad; release publishes this program's
    earlier stores (the CTA barrier first makes every thread's stores part of it)."""
    WORLD_POW2: tl.constexpr = triton.next_power_of_2(WORLD_SIZE)
    peers = tl.arange(0, WORLD_POW2)
    live = peers < WORLD_SIZE
    pads = tl.load(signal_ptrs_ptr + peers, mask=live, other=0).to(tl.pointer_type(tl.int32))
    tl.debug_barrier()
    tl.atomic_xchg(pads + slot * WORLD_SIZE + rank, tl.full([WORLD_POW2], 1, tl.int32), mask=live,
                   sem="release", scope="sys")


@triton.jit
def _healthy(status_ptr):
    """No barrier has given up yet. An atomic read runs on one thread and is broadcast; a plain
    load runs on every thread, and a status landing between two warps' loads would split them."""
    return tl.atomic_add(status_ptr, 0, sem="relaxed", scope="gpu") == 0


@triton.jit
def _await(signal_ptrs_ptr, status_ptr, healthy, slot, rank, timeout_ns, MAX_BLOCKS: tl.constexpr,
           WORLD_SIZE: tl.constexpr):
    """Wait for every rank's flag for `slot` on this rank's pad and consume it (acquire). Gives
    up past `timeout_ns`, or at once when an earlier kernel faulted (`healthy` is false), and
    records why. Returns whether every peer arrived: a program that gave up skips its later
    barriers (measured on H200: a second barrier in the same kernel did not see the first one's
    status write). The flag's CAS (one thread, broadcast) and `_clock_ns` are program-wide
    values, so every thread leaves the loop at the same spin."""
    pad = tl.load(signal_ptrs_ptr + rank).to(tl.pointer_type(tl.int32)) + slot * WORLD_SIZE
    ok = healthy
    if ok:
        start = tl.zeros([], dtype=tl.int64)  # set at the first clock read: 0 is never a time
        for peer in tl.static_range(WORLD_SIZE):
            arrived = tl.atomic_cas(pad + peer, 1, 0, sem="acquire", scope="sys") == 1
            late = False
            spins = 0
            while not (arrived | late):
                _spin_pause()
                arrived = tl.atomic_cas(pad + peer, 1, 0, sem="acquire", scope="sys") == 1
                spins += 1
                if spins % 64 == 0:  # the clock stays off the common, short waits
                    now = _clock_ns()
                    start = tl.where(start == 0, now, start)
                    late = now - start > timeout_ns
            if not arrived:
                _record_fault(status_ptr, slot // MAX_BLOCKS, peer)
            ok = ok & arrived
    tl.debug_barrier()
    return ok


@triton.jit
def _record_fault(status_ptr, phase, peer):
    """status = [1 + phase, peer] in device memory, then in the pinned host copy whose address
    is status[2:4]; the first program to give up wins. The system-scope atomic last makes the
    host copy visible before anything this program does next, such as the step's done word a
    fused record push writes (the host reads the status after seeing that word)."""
    if tl.atomic_cas(status_ptr, 0, 1 + phase, sem="relaxed", scope="gpu") == 0:
        host = tl.load(status_ptr.to(tl.pointer_type(tl.int64)) + 1)
        host = host.to(tl.pointer_type(tl.int32))
        tl.store(host + 1, peer)
        tl.store(host, 1 + phase)
        tl.atomic_xchg(status_ptr + 1, peer, sem="acq_rel", scope="sys")


@triton.jit
def sync(signal_ptrs_ptr, status_ptr, slot, rank, timeout_ns, MAX_BLOCKS: tl.constexpr,
         WORLD_SIZE: tl.constexpr):
    _arrive(signal_ptrs_ptr, slot, rank, WORLD_SIZE)
    # Read after the arrive, so its latency overlaps the flag stores.
    healthy = _healthy(status_ptr)
    return _await(signal_ptrs_ptr, status_ptr, healthy, slot, rank, timeout_ns, MAX_BLOCKS,
                  WORLD_SIZE)
