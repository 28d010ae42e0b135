"""Counter-based random numbers for sampling: a pure function of (seed, position, token id).

A draw never depends on the batch row, the rank or the launch, so whichever process samples a
request draws exactly what a single GPU sampling the whole batch would draw. Every function has
a `@triton.jit` device version and a NumPy version that produce the same bits:

    key  = mix(mix(mix(seed_lo ^ GOLDEN) ^ seed_hi) ^ position)   one per logits row
    bits = mix(mix(key ^ token) ^ key)                             one per token
    u    = ((bits >> 9) + 0.5) * 2**-23                  in (0, 1) strictly, exact in fp32
    g    = -log(-log(u))                                           standard Gumbel

`mix` is the `lowbias32` integer finalizer (two multiply-xorshift rounds); all arithmetic is
uint32 with wrap-around. The second token round keeps two rows whose keys differ in a few low
bits from drawing permutations of the same numbers.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

GOLDEN = 0x9E3779B9
MUL_1 = 0x21F0AAAD
MUL_2 = 0xD35A2D97
# 23 random bits: the largest value, 1 - 2**-24, is still exactly representable in fp32.
UNIFORM_SHIFT = 9
UNIFORM_SCALE = 2.0 ** -23


# --------------------------------------------------------------------------- device versions


@triton.jit
def mix32(h):
    """lowbias32 finalizer on a uint32 tensor."""
    h = h ^ (h >> 16)
    h = h * 0x21F0AAAD
    h = h ^ (h >> 15)
    h = h * 0xD35A2D97
    h = h ^ (h >> 15)
    return h


@triton.jit
def row_key(seed_lo, seed_hi, position):
    """uint32 key of one logits row; int32 inputs are reinterpreted as uint32."""
    h = mix32(seed_lo.to(tl.uint32, bitcast=True) ^ 0x9E3779B9)
    h = mix32(h ^ seed_hi.to(tl.uint32, bitcast=True))
    return mix32(h ^ position.to(tl.uint32, bitcast=True))


@triton.jit
def token_bits(key, token):
    """uint32 random bits of `token` (int32 tensor) under a row key."""
    return mix32(mix32(key ^ token.to(tl.uint32, bitcast=True)) ^ key)


@triton.jit
def uniform(bits):
    """fp32 uniform in (0, 1), both ends excluded."""
    return ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07


@triton.jit
def gumbel(key, token):
    """Standard Gumbel noise for `token` under a row key (fp32)."""
    u = uniform(token_bits(key, token))
    return -tl.log(-tl.log(u))


@triton.jit
def random_bits(seed_lo, seed_hi, position, token):
    """The whole hash in one call: uint32 bits of (seed_lo, seed_hi, position, token)."""
    return token_bits(row_key(seed_lo, seed_hi, position), token)


# --------------------------------------------------------------------------- NumPy versions


def _u32(x) -> np.ndarray:
    """Reinterpret int32/int64/uint32 values as uint32 (two's complement for negatives)."""
    return (np.asarray(x).astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def mix32_np(h: np.ndarray) -> np.ndarray:
    h = _u32(h)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(MUL_1)
        h = h ^ (h >> np.uint32(15))
        h = h * np.uint32(MUL_2)
        h = h ^ (h >> np.uint32(15))
    return h


def row_key_np(seed_lo, seed_hi, position) -> np.ndarray:
    h = mix32_np(_u32(seed_lo) ^ np.uint32(GOLDEN))
    h = mix32_np(h ^ _u32(seed_hi))
    return mix32_np(h ^ _u32(position))


def token_bits_np(key, token) -> np.ndarray:
    key = _u32(key)
    return mix32_np(mix32_np(key ^ _u32(token)) ^ key)


def uniform_np(bits) -> np.ndarray:
    """float64 copy of the fp32 uniform (the fp32 value is exact, so no rounding differs)."""
    return ((_u32(bits) >> np.uint32(UNIFORM_SHIFT)).astype(np.float64) + 0.5) * UNIFORM_SCALE


def gumbel_np(key, token) -> np.ndarray:
    """float64 Gumbel noise of the same uniforms the device draws."""
    return -np.log(-np.log(uniform_np(token_bits_np(key, token))))


def random_bits_np(seed_lo, seed_hi, position, token) -> np.ndarray:
    return token_bits_np(row_key_np(seed_lo, seed_hi, position), token)


def split_seed(seed: int) -> tuple[int, int]:
    """A 64-bit seed as the (lo, hi) int32 halves the slot tables store."""
    to_i32 = lambda u: u - (1 << 32) if u >= (1 << 31) else u  # noqa: E731
    return to_i32(seed & 0xFFFFFFFF), to_i32((seed >> 32) & 0xFFFFFFFF)
