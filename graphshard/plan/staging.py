"""Double-buffered staging of the replicated step inputs, and the step's first and last kernels.

The host writes step k's replicated integers into row k % 2 of a pinned host buffer (plain
memory on CPU): no copy call, no device call. The captured step fetches them itself: its first
operation (`pull`) copies both rows, as far as a step of its bucket uses them, to the device
with the copy engine, and its first kernel
(`fetch`, or the shard step's fused fetch and plan) takes the right one into the device-side
`meta` buffer; its last kernel (`signal_done`, or the p2p record push that ends the step) writes
the step's number into a pinned host word. The host reads that word with one NumPy load to know
which steps finished, so it may stage step k + 1 while step k is still queued or running, and
only waits (for step k - 1) before reusing a row.

Which row the fetch takes is decided on the device, so one graph serves both rows: each row
starts with the step number staged in it, and the fetch takes the oldest row newer than the last
step the device finished (`last`, written by `signal_done`). A row is only rewritten after the
step that used it has finished, so at step k's fetch the rows hold k and k - 1 or k + 1. Warm-up
and timing runs re-run an already fetched row: then no row is newer and the fetch takes the
newest, which is the same batch in both rows.

A host row (int32 words) is [step (int64) | num_reqs | bitmask_on | digest (two int64) |
idx_mapping n | cu_num_logits n+1 | seq_lens n | unused], packed by the step's own n; the fetch
reads its header, then only the 3n + 1 words the step uses, and spreads them into meta's fixed
layout [header | idx_mapping N | cu_num_logits N+1 | seq_lens N] (N = max_num_reqs), which the
step's kernels read. The two rows lie in slices of SLICE words that alternate ([row 0's slice 0
| row 1's slice 0 | row 0's slice 1 | ...]), so the words a step of at most b requests uses lie,
for both rows, in one leading range of the buffer: a bucket's graph copies that range alone.
Copying both whole rows made every step of an engine with max_num_reqs = 1024 ~6 µs slower than
one with 32, whatever its batch (an H200 at batch 1: the copy 3.4 against 0.8 µs, and the fetch
kernel starting 6 µs later after it; BENCHMARKS.md). The digest words are the divergence check's (`graphshard.engine.divergence`:
the host's flags for the inputs word, whose hash the device adds from the fetched arrays, and
the slot-table digest), so its kernels read them from device memory too. A
row being rewritten while a step copies it is never the one that step takes.
Why a copy node and not a kernel reading host memory, measured on an H200: an early fetch
kernel that read the rows with volatile scalar loads took ~31-33 µs per step
(benchmarks/profile_kernels.py); a later fetch reading them with block loads (".cv") timed the
same as the copy and its kernel (41.3 against 41.7 µs per step, top-k + top-p at batch 1; 34.7
against 34.2, greedy at batch 32; BENCHMARKS.md, "The host's turn of a batch-1 step"), so the
copy stays.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import Launch, bound, launch
from graphshard.runtime.memcpy import host_copier
from graphshard.runtime.pdl import lead_dependents

HEADER = 8  # step (2 words), num_reqs, bitmask_on, the inputs flags and the slots digest (2 each)
_HEADER = tl.constexpr(HEADER)
# Words of a row slice: even (a row's int64 header stays aligned), at least HEADER (the header
# lies in one slice); 128 keeps steps of up to 39 requests in the first slice of each row.
SLICE = 128
_SLICE = tl.constexpr(SLICE)
_FETCH_BLOCK = 1024

# The host writes the header's (num_reqs, bitmask_on) pair as one int64 and checks signs through
# the top byte of each int32; both read the words in little-endian order.
assert sys.byteorder == "little", "graphshard's host staging assumes a little-endian host"


def row_width(max_num_reqs: int) -> int:
    """Words per staging row for steps of at most `max_num_reqs` requests, in whole slices."""
    return -(-(HEADER + 3 * max_num_reqs + 1) // SLICE) * SLICE


@triton.jit
def fetch_row(rows_ptr, meta_ptr, last_ptr, max_num_reqs, first, stride, BLOCK: tl.constexpr):
    """This step's staged row into `meta`, blocks `first, first + stride, ...` of its packed
    words (the step's first kernel, or its part of a fused first kernel). `rows_ptr` is the
    device copy of both host rows' leading slices (`Staging.pull`)."""
    heads = rows_ptr.to(tl.pointer_type(tl.int64))
    seq_a = tl.load(heads)
    head_a = tl.load(heads + 1)
    seq_b = tl.load(heads + _SLICE // 2)
    head_b = tl.load(heads + _SLICE // 2 + 1)
    last = tl.load(last_ptr)
    new_a = seq_a > last
    new_b = seq_b > last
    # The older of two new rows; the only new row; with none new (a re-run), the newer row.
    take_b = tl.where(new_a == new_b, (seq_b < seq_a) == new_a, new_b)
    seq = tl.where(take_b, seq_b, seq_a)
    head = tl.where(take_b, head_b, head_a)
    n = (head & 0xFFFFFFFF).to(tl.int32)
    taken = tl.where(take_b, _SLICE, 0)  # the word where the taken row's first slice starts
    meta64 = meta_ptr.to(tl.pointer_type(tl.int64))
    tl.store(meta64, seq)
    tl.store(meta_ptr + 2, n)
    tl.store(meta_ptr + 3, (head >> 32).to(tl.int32))
    tl.store(meta64 + 2, tl.load(heads + taken // 2 + 2))
    tl.store(meta64 + 3, tl.load(heads + taken // 2 + 3))
    # The 3n + 1 words the step uses, packed [idx n | cu n+1 | lens n], spread into meta's
    # fixed layout [idx N | cu N+1 | lens N].
    used = 3 * n + 1
    start = first
    while start < used:
        offs = start + tl.arange(0, BLOCK)
        live = offs < used
        word = offs + _HEADER  # of the row
        v = tl.load(rows_ptr + taken + (word // _SLICE) * (2 * _SLICE) + word % _SLICE, mask=live,
                    other=0)
        tl.store(meta_ptr + _HEADER + meta_offset(offs, n, max_num_reqs), v, mask=live)
        start += stride


@triton.jit
def meta_offset(offs, n, max_num_reqs):
    """Where packed word `offs` of a step's [idx n | cu n+1 | lens n] sits in meta's fixed layout
    [idx N | cu N+1 | lens N] (after the header)."""
    return tl.where(offs < n, offs,
                    tl.where(offs <= 2 * n, offs - n + max_num_reqs,
                             offs - 2 * n - 1 + 2 * max_num_reqs + 1))


@triton.jit(do_not_specialize=["max_num_reqs"])
def _fetch_kernel(rows_ptr, meta_ptr, last_ptr, max_num_reqs,
                  BLOCK: tl.constexpr, LAUNCH_DEPENDENTS: tl.constexpr = False):
    lead_dependents(LAUNCH_DEPENDENTS)  # the scan after it, where that is a dependent
    fetch_row(rows_ptr, meta_ptr, last_ptr, max_num_reqs, tl.program_id(0) * BLOCK,
              tl.num_programs(0) * BLOCK, BLOCK)


@triton.jit
def signal_done(done_address_ptr, meta_seq_ptr, last_ptr):
    """The step's number into `last` and the host's done word, whose address `done_address_ptr`
    holds (the step's last kernel, or the end of a fused last kernel: the record push)."""
    seq = tl.load(meta_seq_ptr)
    tl.store(last_ptr, seq)
    done = tl.load(done_address_ptr).to(tl.pointer_type(tl.int64))
    tl.store(done, seq)


@triton.jit
def _done_kernel(done_address_ptr, meta_seq_ptr, last_ptr):
    signal_done(done_address_ptr, meta_seq_ptr, last_ptr)


class Staging:
    """The pinned double buffer, the device `meta` it is fetched into, and the done word."""

    def __init__(self, max_num_reqs: int, device: torch.device):
        n = self.max_num_reqs = max_num_reqs
        self.width = row_width(n)
        self.device = device
        pinned = device.type == "cuda"
        self.meta = torch.zeros(self.width, dtype=torch.int32, device=device)
        # Both rows, their slices alternating: [width // SLICE, 2, SLICE] words, flat.
        self.rows = torch.zeros(2 * self.width, dtype=torch.int32, pin_memory=pinned)
        # The rows' leading slices as the step's first operation copied them (a copy-engine
        # transfer: a kernel reading host memory pays a host-link round trip per dependent load).
        self.copies = torch.zeros(2 * self.width, dtype=torch.int32, device=device)
        # The last step the device finished (-1: none); written by the step's last kernel.
        self.done = torch.full((1,), -1, dtype=torch.int64, pin_memory=pinned)
        self._last = torch.full((1,), -1, dtype=torch.int64, device=device)
        self._done_address = torch.tensor([self.done.data_ptr()], dtype=torch.int64).to(device)
        self._meta_seq = self.meta[:2].view(torch.int64)
        # meta's header as int64 [step, num_reqs | bitmask_on << 32, inputs flags, slots digest].
        self.header = self.meta[:HEADER].view(torch.int64)
        self.done_view = self.done.numpy()
        self._slices = (slice(HEADER, HEADER + n), slice(HEADER + n, HEADER + 2 * n + 1),
                        slice(HEADER + 2 * n + 1, HEADER + 3 * n + 1))
        host = self.rows.numpy()
        host.view(np.int64)[[0, SLICE // 2]] = -1  # no step staged yet
        # The rows as bytes and as int64 words: a step that fits its rows' first slice is one
        # byte copy of its packed words and two word stores (NumPy slice assignment costs ~3x
        # more per array); a larger one spreads its words over its row's slices.
        self._bytes = memoryview(host).cast("B")
        self._words64 = self._bytes.cast("q")
        self._row_slices = host.reshape(-1, 2, SLICE)
        self._pulls: dict = {}  # `pull`'s (copies, rows, bytes), by max_reqs
        # The pull through the driver (15-28 µs of host time less than `copy_` an eager step on
        # an H200 host): the rows are pinned, so a capture takes it as the copy node `copy_`
        # would make.
        self._copier = host_copier(device)
        self._copies_ptr, self._rows_ptr = self.copies.data_ptr(), self.rows.data_ptr()
        self._fetches: dict = {}  # `fetch`'s launches, by (max_reqs, pdl_next)

    def views(self) -> tuple[torch.Tensor, ...]:
        """Device views of meta: num_reqs [1], bitmask_on [1], idx_mapping, cu_num_logits, seq_lens."""
        return (self.meta[2:3], self.meta[3:4], *(self.meta[s] for s in self._slices))

    def write(self, step: int, idx: np.ndarray, cu: np.ndarray, lens: np.ndarray,
              bitmask_on: bool) -> None:
        """Stage step `step` into its row. The caller has made sure step - 2 finished and that
        the arrays are int32 with n <= max_num_reqs (the engine's checks): the row takes their
        bytes as they are."""
        self._write_row(step & 1, step, idx, cu, lens, bitmask_on)

    def write_both(self, step: int, idx, cu, lens, bitmask_on: bool) -> None:
        """Stage one batch in both rows under one step number (warm-up, capture and timing runs
        re-run it, whichever row they fetch), with digests of 0, the same on every rank. Nothing
        may be in flight."""
        for r in (0, 1):
            self._write_digest(r, 0, 0)
            self._write_row(r, step, idx, cu, lens, bitmask_on)

    def write_digest(self, step: int, flags: int, slots: int) -> None:
        """Step `step`'s host part of the divergence digest (the inputs word's flags, the slots
        digest) into its row, before `write` (step - 2 finished)."""
        self._write_digest(step & 1, flags, slots)

    def _write_digest(self, r: int, flags: int, slots: int) -> None:
        head = r * SLICE // 2  # row r's header, in int64 words
        self._words64[head + 2] = flags
        self._words64[head + 3] = slots

    def _write_row(self, r: int, step: int, idx, cu, lens, bitmask_on: bool) -> None:
        n = idx.shape[0]
        head = r * SLICE // 2
        if HEADER + 3 * n + 1 <= SLICE:
            start = 8 * head + 4 * HEADER
            body = b"".join((idx.tobytes(), cu.tobytes(), lens.tobytes()))  # [idx n | cu n+1 | lens n]
            self._bytes[start:start + len(body)] = body
        else:
            self._spread(r, np.concatenate((idx, cu, lens)))
        self._words64[head + 1] = n | (int(bitmask_on) << 32)
        self._words64[head] = step  # last, so a row's step number never names a half-written row

    def _spread(self, r: int, body: np.ndarray) -> None:
        """Row r's packed words past its header over its slices: the rest of the first, whole
        slices, then the last one's head."""
        slices, first = self._row_slices[:, r, :], SLICE - HEADER
        slices[0, HEADER:] = body[:first]
        full, tail = divmod(body.shape[0] - first, SLICE)
        rest = body[first:]
        slices[1:1 + full] = rest[:full * SLICE].reshape(full, SLICE)
        if tail:
            slices[1 + full, :tail] = rest[full * SLICE:]

    def pull(self, max_reqs: int | None = None) -> None:
        """The step's first operation: the leading slices of both host rows that a step of at
        most `max_reqs` requests (default: max_num_reqs) uses, into `copies` (stream-ordered; a
        copy node in a captured graph, which reads the rows as they are at replay)."""
        pulled = self._pulls.get(max_reqs)
        if pulled is None:  # sliced once per size: slicing costs microseconds a step
            words = self._pulled(max_reqs)
            pulled = self._pulls[max_reqs] = (self.copies[:words], self.rows[:words], 4 * words)
        copies, rows, nbytes = pulled
        if self._copier is None or not self._copier(self._copies_ptr, self._rows_ptr, nbytes):
            copies.copy_(rows, non_blocking=True)

    def _pulled(self, max_reqs: int | None) -> int:
        if max_reqs is None:
            return 2 * self.width
        if isinstance(max_reqs, bool) or not isinstance(max_reqs, (int, np.integer)) \
                or not 0 <= max_reqs <= self.max_num_reqs:
            raise ValueError(f"max_reqs must be an int in [0, {self.max_num_reqs}], got {max_reqs!r}")
        return 2 * row_width(max_reqs)

    def fetch(self, max_reqs: int | None = None, pdl_next: bool = False) -> None:
        """`pull(max_reqs)`, then the kernel that takes this step's row into `meta`: a step of
        at most `max_reqs` requests. `pdl_next`: the kernel launched next is a programmatic
        dependent, which this one lets launch at its start."""
        self.pull(max_reqs)
        fetch = self._fetches.get((max_reqs, pdl_next))
        if fetch is None:  # the same arguments every call: launched as `bound` launches them
            used = HEADER + 3 * (self.max_num_reqs if max_reqs is None else max_reqs) + 1
            fetch = self._fetches[max_reqs, pdl_next] = bound(Launch(
                _fetch_kernel, (triton.cdiv(used, _FETCH_BLOCK),), self.fetch_args(),
                dict(BLOCK=_FETCH_BLOCK, **({"LAUNCH_DEPENDENTS": True} if pdl_next else {}))))
        fetch()

    def signal_done(self) -> None:
        """The step's last kernel: its step number into `last` and the host's done word."""
        launch(_done_kernel, (1,), *self.done_args())

    def fetch_args(self) -> tuple:
        """What a fused first kernel passes to `fetch_row` after `pull`: (copies, meta, last,
        max_num_reqs)."""
        return self.copies, self.meta, self._last, self.max_num_reqs

    def done_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a fused last kernel passes to `signal_done`: (the done word's address, meta's
        step, last)."""
        return self._done_address, self._meta_seq, self._last

    def finished(self) -> int:
        """The last step the device finished (a host read of the done word)."""
        return int(self.done_view[0])
