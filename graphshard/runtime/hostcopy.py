"""A tp = 1 step's records into pinned host memory, then its done word: the device side of
`graphshard.engine.readout`, shared by the publish kernel there and the sampler's finish.

The finish of a small bucket does it itself, in its last program to arrive (`HostTarget` given
to `graphshard.sample.kernels.sample`): the step then ends with the finish, one kernel and one
dependency fewer than a publish kernel after it. A bucket whose records one program would copy
too slowly keeps the publish kernel, a grid of programs (`HOST_COPY_WORDS`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Record words one program copies at most: on an H200 one program stored 1024 records of 46
# words (batch 1024, 20 logprobs) in 17.8 µs, twelve programs in 7.9 (BENCHMARKS.md). Also the
# bound of the finish's own copy: up to it a step's records take one program either way.
HOST_COPY_WORDS = 4096
HOST_COPY_BLOCK = 1024


class HostTarget(NamedTuple):
    """Where a step's records go on the host, and how the host learns that they are there: fixed
    for an engine's lifetime. Only tensors (Triton specialises a tuple's elements, an int on its
    value's divisibility, so the slots' size would make every engine's kernels its own)."""

    slot_addresses: torch.Tensor  # [2] int64: addresses of the pinned int32 slots, by parity
    done_address: torch.Tensor  # [1] int64: address of the pinned done word (int64)
    meta_seq: torch.Tensor  # [1] int64: the step's number (meta's header)
    last: torch.Tensor  # [1] int64: the last step the device finished (the next fetch reads it)
    arrivals: torch.Tensor  # [1] int32: programs of the step's last kernel that arrived; 0 between


@triton.jit
def host_slot(target):
    """(the step's number, the host slot of its parity, the done word's address): all written
    before the step's sampler ran, so the finish loads them first, while the row's work hides
    their latency."""
    seq = tl.load(target.meta_seq)
    slot = tl.load(target.slot_addresses + (seq & 1)).to(tl.pointer_type(tl.int32))
    done = tl.load(target.done_address).to(tl.pointer_type(tl.int64))
    return seq, slot, done


@triton.jit
def copy_to_host(records_ptr, num_words, slot, first, stride, BLOCK: tl.constexpr):
    """Words `first, first + stride, ...` (blocks of BLOCK) of the step's first num_words record
    words [n, width] into its host slot."""
    offs = tl.arange(0, BLOCK)
    start = first
    while start < num_words:
        at = start + offs
        # ".cg": written by other programs of this kernel when the finish copies; L2 has them.
        tl.store(slot + at, tl.load(records_ptr + at, mask=at < num_words, cache_modifier=".cg"),
                 mask=at < num_words)
        start += stride


@triton.jit
def signal_host(target, seq, done):
    """After every copy of the step's records (their stores ordered before this by the caller):
    the step's number into `last` and, released at system scope, into the host's done word, so
    a host that sees the number sees the records."""
    tl.store(target.last, seq)
    tl.atomic_xchg(done, seq, sem="release", scope="sys")


def standalone_target(records: torch.Tensor, pinned: bool) -> tuple[HostTarget, tuple]:
    """(a `HostTarget` of its own for a sampler call outside an engine, the buffers it points at:
    keep them while the target is used). Slots as large as `records`, in pinned host memory
    (`pinned`, as an engine's) or beside `records` on its device (a caller that only wants the
    same compiled finish as an engine's, such as the oracle)."""
    device = records.device
    at = dict(pin_memory=True) if pinned else dict(device=device)
    slots = torch.zeros(2, *records.shape, dtype=torch.int32, **at)
    done = torch.zeros(1, dtype=torch.int64, **at)
    i64 = dict(dtype=torch.int64, device=device)
    target = HostTarget(torch.tensor([slots[0].data_ptr(), slots[1].data_ptr()], **i64),
                        torch.tensor([done.data_ptr()], **i64), torch.zeros(1, **i64),
                        torch.zeros(1, **i64), torch.zeros(1, dtype=torch.int32, device=device))
    return target, (slots, done)
