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

The bits and the uniform are exact on the device; the Gumbel value is fp32 within a few units
in the last place of `s + g` (see `gumbel_of`), and the NumPy version computes it in float64.
"""

from __future__ import annotations

import os

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


if os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def _log2(x):
        return tl.log2(x)  # the interpreter has no inline PTX
else:
    @triton.jit
    def _log2(x):
        """log2 of a positive normal fp32 by the SFU (MUFU.LG2): absolute error below 2**-22
        on [0.5, 2], relative below 2**-22 elsewhere. `tl.log` lowers to libdevice's `logf`,
        ~20 instructions of FMA arithmetic, and a Gumbel value takes two: they were most of a
        random row's streaming pass (`tests.test_compile_sm90` counts the instructions)."""
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


_LN2 = tl.constexpr(0.6931471805599453)
# -log(log 2): g = -log(e) for e = t log 2 is -log(2) log2(t) plus this.
_NEG_LOG_LN2 = tl.constexpr(0.36651292058166435)


@triton.jit
def gumbel_of(bits):
    """Standard Gumbel noise -log(-log(u)) of the uniform `uniform(bits)` (fp32).

    t = -log2(u) is small exactly where the Gumbel value is large (the winners), and there a
    log of u (close to 1) would keep only the log's absolute error: t comes from the series of
    -log2(1 - w) in w = 1 - u, exact in fp32 like u, while w <= 1/8 (8 terms, truncation below
    1e-8 relative), and from log2(u) above (t >= 0.19, so the SFU's absolute error is ~1e-6 of
    it at most). g = -log(t log 2) is then one more log2 with its relative error: at most a few
    units in the last place of a score plus g. Explicit FMAs (the kernels compile without
    contraction, for the scores' sake): none of these roundings is mirrored anywhere."""
    b = bits >> 9
    u = tl.fma(b.to(tl.float32), 1.1920928955078125e-07, 5.960464477539063e-08)
    w = tl.fma((8388607 - b).to(tl.float32), 1.1920928955078125e-07, 5.960464477539063e-08)
    # -log2(1 - w) = sum w^n / (n log 2), by Horner from n = 8.
    series = tl.fma(w, 0.18033688011112042, 0.2060992915555662)
    series = tl.fma(w, series, 0.2404491734814939)
    series = tl.fma(w, series, 0.28853900817779266)
    series = tl.fma(w, series, 0.36067376022224085)
    series = tl.fma(w, series, 0.48089834696298783)
    series = tl.fma(w, series, 0.7213475204444817)
    series = tl.fma(w, series, 1.4426950408889634)
    t = tl.where(w <= 0.125, w * series, -_log2(u))
    return tl.fma(_log2(t), -_LN2, _NEG_LOG_LN2)


@triton.jit
def gumbel(key, token):
    """Standard Gumbel noise for `token` under a row key (fp32)."""
    return gumbel_of(token_bits(key, token))


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
