"""The host's copy of a tp = 1 step's records, written by the step's last kernel.

A decode loop reads every step's tokens on the host. Read through the device buffers that is a
device-to-host copy after the step: a copy call and a stream wait, ~3-6 µs more per step than
what this module does on an H200 (BENCHMARKS.md, `benchmarks/graph_read.py`). Here the step's
last kernel (`publish`, which replaces `signal_done` at tp = 1; a few programs at large batch)
stores the batch's records into pinned host memory itself, then the step's number into the done
word; the host waits for that word (a NumPy load) and copies the rows out with NumPy.

The pinned buffer holds two slots, by step parity, like the staging rows: step k's slot is only
rewritten by step k + 2, which the engine issues only after k finished, so the host may read
either of the last two steps it issued. The last program to finish its part stores the done
word after the others' arrivals (release and acquire at system scope), so a host that sees
step k done sees all of its records.

The same kernel also stores each record's token ids into a contiguous device block (`tokens`,
[max_num_reqs, M]), which the engine returns as `sampled_token_ids`. A view of the records
themselves ([n, M] at a stride of the record width) is not contiguous for n > 1, and a loop's
`out.sampled_token_ids.cpu()` then launches a kernel to gather it before the copy: up to ~10 µs
more a step on an H100 (BENCHMARKS.md, "`sampled_token_ids` in a contiguous block at tp = 1").
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from graphshard.plan.staging import Staging
from graphshard.runtime.launch import Launch, bound
from graphshard.runtime.pdl import check_pdl, pdl_options, follow_producer

_BLOCK = 1024
# Words one publish program copies at most: on an H200 one program stored 1024 records of 46
# words (batch 1024, 20 logprobs) in 17.8 µs, twelve programs in 7.9 (BENCHMARKS.md).
_WORDS_PER_PROGRAM = 4096


@triton.jit
def _publish_kernel(records_ptr, tokens_ptr, num_reqs_ptr, host_address_ptr, done_address_ptr,
                    meta_seq_ptr, last_ptr, arrivals_ptr, WIDTH: tl.constexpr, TOKENS: tl.constexpr,
                    SLOT: tl.constexpr, BLOCK: tl.constexpr, SHARED: tl.constexpr,
                    PDL: tl.constexpr = False):
    """The first num_reqs records [n, WIDTH] into the host slot of this step's parity (SLOT words
    each), and their first TOKENS words into `tokens` [n, TOKENS] (none when TOKENS is 0),
    BLOCK words per program and pass; then the last program to finish its part (with SHARED,
    several programs; else the one) stores the step's number into `last` and the done word
    (`staging.signal_done`'s stores). PDL: launched as a programmatic dependent."""
    follow_producer(PDL)
    n = tl.load(num_reqs_ptr)
    seq = tl.load(meta_seq_ptr)
    host = tl.load(host_address_ptr).to(tl.pointer_type(tl.int32)) + (seq & 1) * SLOT
    words = n * WIDTH
    offs = tl.arange(0, BLOCK)
    start = tl.program_id(0) * BLOCK
    while start < words:
        at = start + offs
        words_in = at < words
        values = tl.load(records_ptr + at, mask=words_in)
        tl.store(host + at, values, mask=words_in)
        if TOKENS > 0:  # device memory read after the step in stream order: no fence needed
            column = at % WIDTH
            tl.store(tokens_ptr + (at // WIDTH) * TOKENS + column, values,
                     mask=words_in & (column < TOKENS))
        start += tl.num_programs(0) * BLOCK
    # Every thread's stores before the arrival; releases and acquires at system scope, so the
    # host that sees the done word sees every program's stores. One program (small batches)
    # needs no arrival: the release of the done word orders its own stores.
    tl.debug_barrier()
    last = True
    if SHARED:
        last = tl.atomic_add(arrivals_ptr, 1, sem="acq_rel", scope="sys") == \
            tl.num_programs(0) - 1
    if last:
        tl.store(arrivals_ptr, 0)  # for the next step, which runs after this kernel
        tl.store(last_ptr, seq)
        done = tl.load(done_address_ptr).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(done, seq, sem="release", scope="sys")


class HostRecords:
    """Pinned [2, max_num_reqs, width] int32 copies of the records (plain memory on CPU), one slot
    per step parity, and `tokens`, the device block [max_num_reqs, M] of their token ids (None
    without one)."""

    def __init__(self, records: torch.Tensor, staged: Staging, num_reqs: torch.Tensor, *,
                 tokens_per_record: int = 0, pdl: bool = False):
        """`records`: the step's contiguous [max_num_reqs, width] int32 output buffer; `staged`:
        the engine's staging (its done word); `num_reqs`: meta's device n; `tokens_per_record`:
        M, the leading words of a record copied into `tokens` (0: no such block); `pdl`: launch
        the publish as a programmatic dependent of the kernel before it."""
        if records.dtype != torch.int32 or records.dim() != 2 or not records.is_contiguous():
            raise ValueError(f"records must be a contiguous 2-D int32 tensor, got "
                             f"{records.dtype} {tuple(records.shape)} strides {records.stride()}")
        if isinstance(tokens_per_record, bool) or not isinstance(tokens_per_record, int) \
                or not 0 <= tokens_per_record <= records.shape[1]:
            raise ValueError(f"tokens_per_record must be an int in [0, {records.shape[1]}], got "
                             f"{tokens_per_record!r}")
        device = records.device
        check_pdl(pdl, device, "HostRecords")
        self.records, self.staged, self.num_reqs = records, staged, num_reqs
        self._dependent = pdl_options(pdl)
        self.slots = torch.zeros(2, *records.shape, dtype=torch.int32,
                                 pin_memory=device.type == "cuda")
        self._view = self.slots.numpy()
        self._address = torch.tensor([self.slots.data_ptr()], dtype=torch.int64).to(device)
        self._width = records.shape[1]
        self._slot_words = records.numel()
        self._arrivals = torch.zeros(1, dtype=torch.int32, device=device)
        self._publishes: dict = {}  # `publish`'s launches, by max_num_reqs
        self.tokens = torch.full((records.shape[0], tokens_per_record), -1, dtype=torch.int32,
                                 device=device) if tokens_per_record else None

    def publish(self, max_num_reqs: int) -> None:
        """The step's last kernel (graph-safe; its grid sized for `max_num_reqs` requests): its
        records to the host, then its done word."""
        publish = self._publishes.get(max_num_reqs)
        if publish is None:  # the same arguments every call: launched as `bound` launches them
            words = min(max_num_reqs, self.records.shape[0]) * self._width
            grid = (max(1, triton.cdiv(words, _WORDS_PER_PROGRAM)),)
            tokens = self.tokens if self.tokens is not None else self.records  # unused without
            publish = self._publishes[max_num_reqs] = bound(Launch(
                _publish_kernel, grid,
                (self.records, tokens, self.num_reqs, self._address, *self.staged.done_args(),
                 self._arrivals),
                dict(WIDTH=self._width, TOKENS=0 if self.tokens is None else self.tokens.shape[1],
                     SLOT=self._slot_words, BLOCK=_BLOCK, SHARED=grid[0] > 1, **self._dependent)))
        publish()

    def rows(self, step: int, n: int) -> np.ndarray:
        """A copy of step `step`'s first n records (the caller made sure it finished)."""
        return self._view[step & 1, :n].copy()
