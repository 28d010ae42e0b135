"""The divergence check's digest on the device: what a rank sends, and the judge that compares
every rank's digest (`graphshard.engine.divergence` describes the check and keeps its host side).

A digest is [step, inputs, slots, spare] as int64, built in one program from the step's fetched
inputs (`load_digest`); the transports exchange it inside the step and one program judges the
digests (`judge`). The p2p kernels call both themselves; a padded transport's step seals the
digest into the rows its record gather carries (`seal`) and ends with `judge_gathered`.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from graphshard.plan.staging import HEADER, meta_offset, signal_done
from graphshard.runtime.launch import launch
from graphshard.sample.rng import GOLDEN, mix32, mix32_np, token_bits, token_bits_np

DIGEST_WORDS = 4  # int64: step, inputs, slots, spare
DIGEST_INT32 = 2 * DIGEST_WORDS  # the same digest in int32 words (as a record gather carries it)
# int64: step, any, step mask, inputs mask, slots mask, refused mask, rank 0's step, spare
VERDICT_WORDS = 8
# Host flags in the inputs word's high half (`graphshard.engine.divergence.DivergenceCheck.flags`).
FLAG_BITMASK_ON, FLAG_DRAFTS, FLAG_REFUSED = 1 << 32, 1 << 33, 1 << 34
# For the kernels (Triton reads module globals only as constexpr instances).
REFUSED = tl.constexpr(FLAG_REFUSED)
NOT_REFUSED = tl.constexpr(~FLAG_REFUSED)
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
def judge(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, WORLD_SIZE: tl.constexpr):
    """Compare every rank's digest with rank 0's; on any difference write the verdict into the
    pinned row of this step's parity. Rank r's digest (DIGEST_WORDS int64) starts at int32 word
    r * rank_stride of `digests_ptr`: a p2p digest buffer, or the rows a padded transport's
    record gather carried. Called by one program, before the step's done word is written (by
    it, or by a program that synchronizes with it)."""
    words = digests_ptr.to(tl.pointer_type(tl.int32))
    ranks = tl.arange(0, triton.next_power_of_2(WORLD_SIZE))
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
                  last_ptr, WORLD_SIZE: tl.constexpr, DONE: tl.constexpr):
    judge(digests_ptr, rank_stride, verdicts_address_ptr, seq_ptr, WORLD_SIZE)
    if DONE:
        # The step's last kernel too: `judge` made a verdict visible before this done word.
        signal_done(done_address_ptr, seq_ptr, last_ptr)


def seal(header: torch.Tensor, max_num_reqs: int, out: torch.Tensor) -> None:
    """This rank's digest of the running step (its fetched inputs `header`, int64) into `out`
    (int32, >= DIGEST_INT32 contiguous words), for the step's gather to carry (graph-safe)."""
    launch(_seal_kernel, (1,), header, max_num_reqs, out)


def judge_gathered(gathered: torch.Tensor, rank_stride: int, verdicts_address: torch.Tensor,
                   header: torch.Tensor, world_size: int, done_args: tuple | None = None) -> None:
    """Judge every rank's digest in `gathered` (int32; rank r's at word r * rank_stride) and
    write the verdict through `verdicts_address` (graph-safe). With `done_args`
    (`Staging.done_args()`) the same kernel then ends the step."""
    address, _, last = done_args if done_args is not None else (header,) * 3
    launch(_judge_kernel, (1,), gathered, rank_stride, verdicts_address, header, address, last,
           WORLD_SIZE=world_size, DONE=done_args is not None)
