"""The always-on rank-divergence check: a digest of what must agree, compared inside the step.

The sharded step is only correct while every rank passes the same replicated inputs and holds
the same slot tables. Each step the host writes two digest words into the header of its staged
inputs (`graphshard.plan.staging`), so the step's copy brings them to the device with the
inputs and its kernels read them from device memory (a kernel's read of pinned host memory is a
round trip over the host link). The device's digest is [step, inputs, slots, spare] as int64:
- step: the step number the device fetched;
- inputs: a 32-bit hash of the replicated arrays the device fetched, computed by the kernel
  that sends the digest (`inputs_digest`; the host's cost does not grow with the batch), plus
  flags the host sets in the high word (bitmask on, drafts given, and "refused": this rank
  refused the batch for a slot that holds no request here);
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

import numpy as np
import torch
import triton
import triton.language as tl

from graphshard.errors import RankDivergenceError
from graphshard.plan.staging import HEADER, Staging, meta_offset, signal_done
from graphshard.runtime.launch import launch
from graphshard.sample.rng import GOLDEN, mix32, mix32_np, token_bits, token_bits_np

DIGEST_WORDS = 4  # int64: step, inputs, slots, spare
DIGEST_INT32 = 2 * DIGEST_WORDS  # the same digest in int32 words (as a record gather carries it)
# int64: step, any, step mask, inputs mask, slots mask, refused mask, rank 0's step, spare
VERDICT_WORDS = 8
_BITMASK_ON, _DRAFTS, _REFUSED = 1 << 32, 1 << 33, 1 << 34
# For the kernels (Triton reads module globals only as constexpr instances).
REFUSED = tl.constexpr(_REFUSED)
NOT_REFUSED = tl.constexpr(~_REFUSED)
DIGEST_SIZE = tl.constexpr(DIGEST_WORDS)


_LENGTH_KEY = 0x7F4A7C15  # keys the batch size into the inputs hash
_LENGTH_KEY_C, _GOLDEN_C = tl.constexpr(_LENGTH_KEY), tl.constexpr(GOLDEN)
_META_HEADER = tl.constexpr(HEADER)
_HASH_BLOCK = tl.constexpr(512)


@triton.jit
def load_digest(meta_ptr, max_num_reqs):
    """This rank's digest [DIGEST_WORDS] int64 of the running step, from the fetched inputs
    `meta_ptr` (int64 view of `Staging.meta`: header [step, num_reqs | bitmask_on, inputs,
    slots], then the arrays). Runs in one program."""
    words = tl.arange(0, 4)
    # [step, host flags, slots, spare = 0]
    head = tl.load(meta_ptr + tl.where(words == 0, 0, words + 1), mask=words < 3, other=0)
    hashed = inputs_digest(meta_ptr.to(tl.pointer_type(tl.int32)), max_num_reqs)
    return tl.where(words == 1, head | hashed.to(tl.int64), head)


@triton.jit
def inputs_digest(meta_ptr, max_num_reqs):
    """uint32 hash of the step's idx_mapping, cu_num_logits and seq_lens as fetched into `meta`
    (int32), in their packed order [idx n | cu n+1 | lens n]. Each word is hashed under a key of
    its position and the hashes are XORed, so a change to any one word always changes it; the
    batch size is keyed in last. `inputs_digest_np` is the reference."""
    n = tl.load(meta_ptr + 2)
    used = 3 * n + 1
    acc = tl.zeros([_HASH_BLOCK], tl.uint32)
    start = 0
    while start < used:
        offs = start + tl.arange(0, _HASH_BLOCK)
        live = offs < used
        w = tl.load(meta_ptr + _META_HEADER + meta_offset(offs, n, max_num_reqs), mask=live,
                    other=0)
        h = token_bits(mix32(offs.to(tl.uint32) ^ _GOLDEN_C), w)
        acc = acc ^ tl.where(live, h, tl.zeros_like(h))
        start += _HASH_BLOCK
    return mix32(tl.xor_sum(acc, 0) ^ mix32(n.to(tl.uint32) ^ _LENGTH_KEY_C))


def inputs_digest_np(idx: np.ndarray, cu: np.ndarray, lens: np.ndarray) -> int:
    """NumPy reference of `inputs_digest`."""
    words = np.concatenate([idx, cu, lens]).astype(np.int32)
    h = token_bits_np(mix32_np(np.arange(words.size) ^ GOLDEN), words)
    return int(mix32_np(np.bitwise_xor.reduce(h, initial=np.uint32(0)) ^
                        mix32_np(np.uint32(idx.size) ^ np.uint32(_LENGTH_KEY))))


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
@triton.jit(do_not_specialize=["max_num_reqs"], do_not_specialize_on_alignment=["out_ptr"])
def _seal_kernel(meta_ptr, max_num_reqs, out_ptr):
    # [DIGEST_WORDS] int64 as little-endian int32 pairs: a record row need not be 8-byte aligned.
    digest = load_digest(meta_ptr, max_num_reqs)
    words = tl.arange(0, 4)
    tl.store(out_ptr + 2 * words, (digest & 0xFFFFFFFF).to(tl.int32))
    tl.store(out_ptr + 2 * words + 1, (digest >> 32).to(tl.int32))


@triton.jit(do_not_specialize=["rank_stride"], do_not_specialize_on_alignment=["digests_ptr"])
def _judge_kernel(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, done_address_ptr,
                  last_ptr, WORLD_SIZE: tl.constexpr, WORLD_POW2: tl.constexpr,
                  DONE: tl.constexpr):
    judge(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, WORLD_SIZE, WORLD_POW2)
    if DONE:
        # The step's last kernel too: `judge` made a verdict visible before this done word.
        signal_done(done_address_ptr, seq_ptr, last_ptr)


class DivergenceCheck:
    """One engine's digests and verdicts (host side), and what the transports pass its kernels.

    `begin` runs on the step's host path (no device call, no buffer allocated); `check` reads the
    pinned verdict row of a step once it has finished."""

    def __init__(self, rank: int, world_size: int, device: torch.device, staging: Staging):
        pinned = device.type == "cuda"
        self.rank, self.world_size, self.device = rank, world_size, device
        self.staging = staging  # the step's staged inputs, whose header carries the digest
        # The running step's staged header on the device: int64 [step, num_reqs | bitmask_on,
        # inputs, slots]; its first word is the step number.
        self.header = staging.header
        self.verdicts = torch.full((2, VERDICT_WORDS), -1, dtype=torch.int64, pin_memory=pinned)
        self._verdicts = self.verdicts.numpy()
        # Where the kernels write a verdict: the pinned rows' address, on the device.
        self.verdicts_address = torch.tensor([self.verdicts.data_ptr()],
                                             dtype=torch.int64).to(device)
        self.reported = -1  # the last step whose divergence (or refusal) was raised

    # -- host path ----------------------------------------------------------------------------
    def begin(self, step: int, slots: int, faults, flags: int) -> None:
        """Step `step`'s host part, after `faults.admit(step)`: on CUDA, raise first for a finished
        step (step - 2: admit waited for it) judged divergent that no call has raised for yet,
        so its tokens never pass unnoticed; then seal this step's digest."""
        if not faults.synchronous and step - 2 > self.reported \
                and self._verdicts[step & 1, 0] == step - 2:
            faults.abandon(step)
            self.check(step - 2)
        self.seal(step, slots, flags)

    def settle_refusal(self, step: int, refusal: Exception, wait) -> None:
        """This rank refused step `step` for a slot it holds no request in and ran the step only
        so its peers would learn it: once `wait(step)` returns the step is judged; raise the
        refusal itself where every rank refused alike, else the divergence."""
        wait(step)
        if not self.only_refusals(step):
            self.check(step)
        self.reported = max(self.reported, step)
        raise refusal

    def seal(self, step: int, slots: int, flags: int) -> None:
        """Write step `step`'s host part of the digest into its staging row (step - 2 has
        finished: the row is free); the device hashes the arrays it fetched. Warm-up, capture
        and timing runs stage host parts of 0 (`Staging.write_both`)."""
        self.staging.write_digest(step, flags, slots)

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
        launch(_seal_kernel, (1,), self.header, self.staging.max_num_reqs, out)

    def judge_gathered(self, gathered: torch.Tensor, rank_stride: int, done=None) -> None:
        """Judge every rank's digest in `gathered` (int32; rank r's at word r * rank_stride) and
        write the verdict (graph-safe). With `done` (a `Staging`) the same kernel then ends the
        step, so judging adds no kernel to a step that ends here."""
        address, _, last = done.done_args() if done is not None else (self.header,) * 3
        launch(_judge_kernel, (1,), gathered, rank_stride, self.verdicts_address, self.header,
               address, last, WORLD_SIZE=self.world_size,
               WORLD_POW2=triton.next_power_of_2(self.world_size), DONE=done is not None)


def _ranks(mask) -> list[int]:
    mask = int(mask)
    return [r for r in range(mask.bit_length()) if mask >> r & 1]
