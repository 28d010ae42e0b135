"""The always-on rank-divergence check: a digest of what must agree, compared inside the step.

The sharded step is only correct while every rank passes the same replicated inputs and holds
the same slot tables. Each step the host writes two digest words into the header of its staged
inputs (`graphshard.plan.staging`), so the step's copy brings them to the device with the
inputs and its kernels read them from device memory (a kernel's read of pinned host memory is a
round trip over the host link). The device's digest is [step, inputs, slots, spare] as int64:
- step: the step number the device fetched;
- inputs: CRC-32 of the replicated arrays, plus flags in the high word (bitmask on, drafts
  given, and "refused": this rank refused the batch for a slot that holds no request here);
- slots: the XOR of per-slot hashes of (slot, params) that `add_request`/`remove_request`
  maintain (`graphshard.engine.agreement.SlotDigest`).
The captured step exchanges the digests (p2p: pushed with the rows; nccl/gloo: appended to the
records of the step's record all-gather, or on their own in a replicate step) and `judge`
compares them with rank 0's. Every rank judges the same digests, so every rank reaches the same
verdict; a step whose digests differ writes it into a pinned host row, which the host reads
with one NumPy load once the step has finished.
Nothing syncs with the host and nothing branches on the host inside the step.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
import triton
import triton.language as tl

from graphshard.errors import RankDivergenceError
from graphshard.plan.staging import Staging
from graphshard.runtime.launch import launch

DIGEST_WORDS = 4  # int64: step, inputs, slots, spare
DIGEST_INT32 = 2 * DIGEST_WORDS  # the same digest in int32 words (as a record gather carries it)
# int64: step, any, step mask, inputs mask, slots mask, refused mask, rank 0's step, spare
VERDICT_WORDS = 8
_BITMASK_ON, _DRAFTS, _REFUSED = 1 << 32, 1 << 33, 1 << 34
# For the kernels (Triton reads module globals only as constexpr instances).
REFUSED = tl.constexpr(_REFUSED)
NOT_REFUSED = tl.constexpr(~_REFUSED)
DIGEST_SIZE = tl.constexpr(DIGEST_WORDS)


@triton.jit
def load_digest(header_ptr):
    """This rank's digest [DIGEST_WORDS] int64 of the running step, from the staged header
    `header_ptr` (int64 [step, num_reqs | bitmask_on, inputs, slots], device memory)."""
    words = tl.arange(0, 4)
    # [step, inputs, slots, spare = 0]
    return tl.load(header_ptr + tl.where(words == 0, 0, words + 1), mask=words < 3, other=0)


@triton.jit
def _rank_mask(differ, ranks):
    return tl.sum(tl.where(differ, tl.full(ranks.shape, 1, tl.int64) << ranks.to(tl.int64), 0),
                  axis=0)


@triton.jit
def _words(base, j, live):
    """Word j of digests at int32 pointers `base`: an int64 stored as two little-endian int32."""
    lo = tl.load(base + 2 * j, mask=live, other=0).to(tl.int64) & 0xFFFFFFFF
    hi = tl.load(base + 2 * j + 1, mask=live, other=0).to(tl.int64)
    return lo | (hi << 32)


@triton.jit
def judge(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, WORLD_SIZE: tl.constexpr,
          WORLD_POW2: tl.constexpr):
    """Compare every rank's digest with rank 0's; on any difference write the verdict into the
    pinned row of this step's parity. Rank r's digest (DIGEST_WORDS int64) starts at int32 word
    r * rank_stride of `digests_ptr`: a p2p digest buffer, or the rows a padded transport's
    record gather carried. Called by one program, before the step's done word is written (by
    it, or by a program that synchronizes with it)."""
    words = digests_ptr.to(tl.pointer_type(tl.int32))
    ranks = tl.arange(0, WORLD_POW2)
    live = ranks < WORLD_SIZE
    base = words + ranks * rank_stride
    steps = _words(base, 0, live)
    inputs = _words(base, 1, live)
    slots = _words(base, 2, live)
    step0 = tl.sum(tl.where(ranks == 0, steps, 0), axis=0)
    inputs0 = tl.sum(tl.where(ranks == 0, inputs, 0), axis=0) & NOT_REFUSED
    slots0 = tl.sum(tl.where(ranks == 0, slots, 0), axis=0)
    step_mask = _rank_mask(live & (steps != step0), ranks)
    inputs_mask = _rank_mask(live & ((inputs & NOT_REFUSED) != inputs0), ranks)
    slots_mask = _rank_mask(live & (slots != slots0), ranks)
    refused_mask = _rank_mask(live & ((inputs & REFUSED) != 0), ranks)
    verdict = step_mask | inputs_mask | slots_mask | refused_mask
    if verdict != 0:
        seq = tl.load(seq_ptr)
        row = tl.load(verdicts_address_ptr).to(tl.pointer_type(tl.int64)) + (seq & 1) * 8
        tl.store(row + 1, verdict)
        tl.store(row + 2, step_mask)
        tl.store(row + 3, inputs_mask)
        tl.store(row + 4, slots_mask)
        tl.store(row + 5, refused_mask)
        tl.store(row + 6, step0)  # the message names rank 0's step: the same text everywhere
        tl.store(row, seq)  # last: the row names its step only once it is whole
        # The verdict (host memory) is visible before anything this program does next, such as
        # the arrival that lets another program write the done word.
        tl.debug_barrier()
        tl.atomic_add(words + 6, 0, sem="release", scope="sys")  # rank 0's spare word


# Where a record gather carries the digests, their place depends on the step's capacity: one
# compiled variant serves every capacity.
@triton.jit(do_not_specialize_on_alignment=["out_ptr"])
def _seal_kernel(header_ptr, out_ptr):
    # [DIGEST_WORDS] int64 as little-endian int32 pairs: a record row need not be 8-byte aligned.
    digest = load_digest(header_ptr)
    words = tl.arange(0, 4)
    tl.store(out_ptr + 2 * words, (digest & 0xFFFFFFFF).to(tl.int32))
    tl.store(out_ptr + 2 * words + 1, (digest >> 32).to(tl.int32))


@triton.jit(do_not_specialize=["rank_stride"], do_not_specialize_on_alignment=["digests_ptr"])
def _judge_kernel(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr,
                  WORLD_SIZE: tl.constexpr, WORLD_POW2: tl.constexpr):
    judge(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, WORLD_SIZE, WORLD_POW2)


class DivergenceCheck:
    """One engine's digests and verdicts (host side), and what the transports pass its kernels.

    `begin` runs on the step's host path (no device call, no buffer allocated); `check` reads the
    pinned verdict row of a step once it has finished."""

    def __init__(self, rank: int, world_size: int, device: torch.device, staging: Staging,
                 one_row: bool):
        pinned = device.type == "cuda"
        self.rank, self.world_size, self.device = rank, world_size, device
        self.staging = staging  # the step's staged inputs, whose header carries the digest
        # The running step's staged header on the device: int64 [step, num_reqs | bitmask_on,
        # inputs, slots]; its first word is the step number.
        self.header = staging.header
        self._one_row = one_row  # then cu_num_logits is always 0..n: nothing to hash
        self.verdicts = torch.full((2, VERDICT_WORDS), -1, dtype=torch.int64, pin_memory=pinned)
        self._verdicts = self.verdicts.numpy()
        # Where the kernels write a verdict: the pinned rows' address, on the device.
        self.verdicts_address = torch.tensor([self.verdicts.data_ptr()],
                                             dtype=torch.int64).to(device)
        self.reported = -1  # the last step whose divergence (or refusal) was raised

    # -- host path ----------------------------------------------------------------------------
    def begin(self, step: int, idx, cu, lens, slots: int, faults, flags: int) -> None:
        """Step `step`'s host part, after `faults.admit(step)`: on CUDA, raise first for a finished
        step (step - 2: admit waited for it) judged divergent that no call has raised for yet,
        so its tokens never pass unnoticed; then seal this step's digest."""
        if not faults.synchronous and step - 2 > self.reported \
                and self._verdicts[step & 1, 0] == step - 2:
            faults.abandon(step)
            self.check(step - 2)
        self.seal(step, idx, cu, lens, slots, flags)

    def settle_refusal(self, step: int, refusal: Exception, wait) -> None:
        """This rank refused step `step` for a slot it holds no request in and ran the step only
        so its peers would learn it: once `wait(step)` returns the step is judged; raise the
        refusal itself where every rank refused alike, else the divergence."""
        wait(step)
        if not self.only_refusals(step):
            self.check(step)
        self.reported = max(self.reported, step)
        raise refusal

    def seal(self, step: int, idx: np.ndarray, cu: np.ndarray, lens: np.ndarray, slots: int,
             flags: int) -> None:
        """Write step `step`'s digest into its staging row (step - 2 has finished: the row is
        free). Warm-up, capture and timing runs stage digests of 0 (`Staging.write_both`)."""
        try:
            h = digest_arrays(idx, cu, lens, self._one_row)
        except BufferError:  # a non-contiguous array on the exact-check path
            h = digest_arrays(*(np.ascontiguousarray(a) for a in (idx, cu, lens)), self._one_row)
        self.staging.write_digest(step, h | flags, slots)

    @staticmethod
    def flags(bitmask_on: bool, drafts: bool, refused: bool = False) -> int:
        return (_BITMASK_ON if bitmask_on else 0) | (_DRAFTS if drafts else 0) | \
            (_REFUSED if refused else 0)

    def check(self, step: int) -> None:
        """Raise `RankDivergenceError` if finished step `step` diverged."""
        if step >= 0 and self._verdicts[step & 1, 0] == step:
            self.reported = max(self.reported, step)
            raise RankDivergenceError(self.describe(step))

    def only_refusals(self, step: int) -> bool:
        """Every rank refused step `step` the same way and nothing else differed."""
        v = self._verdicts[step & 1]
        everyone = (1 << self.world_size) - 1
        return v[0] == step and v[5] == everyone and not (v[2] | v[3] | v[4])

    def describe(self, step: int) -> str:
        """The verdict of step `step` in words, the same on every rank."""
        v = self._verdicts[step & 1]
        parts = [f"ranks {_ranks(v[mask])} differ from rank 0 in their {what}"
                 for mask, what in ((2, "step counts (a rank skipped or repeated a step)"),
                                    (3, "replicated step inputs"),
                                    (4, "active requests and their sampling parameters"))
                 if v[mask]]
        if v[5]:
            parts.append(f"ranks {_ranks(v[5])} refused the batch (a slot in it holds no "
                         "request there)")
        return (f"step {v[6]} (rank 0's count): the ranks diverged: {'; '.join(parts)}; its "
                "results were discarded; every rank must make identical calls")

    # -- the step's end, on padded transports (p2p does this inside its own kernels) ------------
    def seal_on_device(self, out: torch.Tensor) -> None:
        """This rank's digest into `out` (int32, >= DIGEST_INT32 contiguous words), for the
        step's gather to carry (graph-safe)."""
        launch(_seal_kernel, (1,), self.header, out)

    def judge_gathered(self, gathered: torch.Tensor, rank_stride: int) -> None:
        """Judge every rank's digest in `gathered` (int32; rank r's at word r * rank_stride) and
        write the verdict (graph-safe)."""
        launch(_judge_kernel, (1,), gathered, rank_stride, self.verdicts_address, self.header,
               WORLD_SIZE=self.world_size, WORLD_POW2=triton.next_power_of_2(self.world_size))


def digest_arrays(idx: np.ndarray, cu: np.ndarray, lens: np.ndarray, one_row: bool) -> int:
    """CRC-32 of the replicated int32 arrays (cu_num_logits left out where it is always 0..n)."""
    h = zlib.crc32(lens, zlib.crc32(idx))
    return h if one_row else zlib.crc32(cu, h)


def _ranks(mask) -> list[int]:
    mask = int(mask)
    return [r for r in range(mask.bit_length()) if mask >> r & 1]
