"""A logprob row's pass over one chunk (`rows.sum_chunk`, through `rows.scan_span`) and the
running-sum pass it replaced (`rows.scan_chunk`) against a float64 reference, on adversarial
chunks of every logits dtype: NaN flag, maximum, its lowest column and per-lane maxima exactly
(as values: a maximum of zero may be -0.0 in one pass and 0.0 in the other, which changes no
token or logprob), the mass within rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from graphshard.sample import rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
INF, NAN = float("inf"), float("nan")


@triton.jit
def _pass_kernel(row_ptr, out_ptr, lo, SPAN: tl.constexpr, VOCAB: tl.constexpr,
                 BLOCK: tl.constexpr, RUNNING: tl.constexpr):
    no_key = tl.full((), 0, tl.uint32)
    if RUNNING:
        res = rows.scan_chunk(row_ptr, row_ptr, False, lo, SPAN, VOCAB, 1.0, no_key, no_key,
                              float("-inf"), False, False, True, BLOCK, False)
    else:
        res = rows.scan_span(row_ptr, row_ptr, False, lo, 1.0, no_key, False, False, True, SPAN,
                             VOCAB, BLOCK, False)
    has_nan, max_x, arg_x, lane_x, mass = res[0], res[1], res[2], res[5], res[8]
    # [4 + BLOCK] int32: NaN flag, max bits, its column, mass bits, per-lane maxima bits
    tl.store(out_ptr, has_nan.to(tl.int32))
    tl.store(out_ptr + 1, max_x.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 2, arg_x)
    tl.store(out_ptr + 3, mass.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 4 + tl.arange(0, BLOCK), lane_x.to(tl.int32, bitcast=True))


def chunks(rs, span: int, block: int, big: float) -> dict[str, np.ndarray]:
    pick = lambda k: rs.choice(span, k, replace=False)  # noqa: E731
    out = {"randn": rs.standard_normal(span) * 3, "ints": rs.integers(-3, 4, span) * 1.0,
           "equal": np.ones(span), "all_nan": np.full(span, NAN), "all_neg_inf": np.full(span, -INF)}
    x = rs.standard_normal(span)
    x[pick(6)] = 9.0
    out["ties"] = x
    x = rs.integers(-3, 4, span) * 1.0
    x[pick(5)] = NAN
    out["nan_and_ties"] = x
    x = rs.standard_normal(span)
    x[0], x[span - block], x[min(block + 1, span - 1)] = NAN, 20.0, NAN
    out["nan_first"] = x
    x = rs.standard_normal(span)
    x[::2] = -INF
    out["half_neg_inf"] = x
    x = np.full(span, -big)
    x[pick(span // 3)] = -INF
    out["lowest_finite"] = x
    out["plus_minus_max"] = np.where(np.arange(span) % 2, big, -big)
    x = -rs.random(span) - 0.5
    x[[0, span // 2, span - 1]] = [0.0, -0.0, 0.0]
    out["signed_zeros"] = x
    x = rs.standard_normal(span)
    x[span // 3] = INF
    out["plus_inf"] = x
    return out


def run_pass(row: torch.Tensor, lo: int, span: int, vocab: int, block: int, running: bool):
    out = torch.zeros(4 + block, dtype=torch.int32, device=DEVICE)
    _pass_kernel[(1,)](row, out, lo, SPAN=span, VOCAB=vocab, BLOCK=block, RUNNING=running,
                       num_warps=8 if block >= 1024 else 4, enable_fp_fusion=False)
    o = out.cpu().numpy()
    f = o.view(np.float32)
    return int(o[0]), float(f[1]), int(o[2]), float(f[3]), o[4:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block, span, padding", [(32, 32, 0), (32, 64, 0), (32, 512, 0),
                                                  (32, 512, 19), (1024, 8192, 1500)])
def test_logprob_pass_matches_the_running_sum_and_the_reference(dtype, block, span, padding):
    # The chunk is the row's second, and the vocabulary ends `padding` columns before its end;
    # the columns around it (the row's other chunks, the padding) hold values that would win.
    # 1024 lanes over 8 warps are the scan's tile on a GPU.
    rs = np.random.default_rng(block + span + padding)
    big = float(torch.finfo(dtype).max)
    lo, vocab = span, 2 * span - padding
    cols = lo + np.arange(span)
    for kind, chunk in chunks(rs, span, block, big).items():
        row = np.full(3 * span, 1e4)
        row[lo:lo + span] = chunk
        row[vocab:] = np.where(np.arange(3 * span - vocab) % 2, 1e4, NAN)
        logits = torch.tensor(row).to(dtype)
        seen = logits.double().numpy()[lo:lo + span].copy()
        nan = int(np.isnan(seen[cols < vocab]).any())
        seen[(cols >= vocab) | np.isnan(seen)] = -INF
        top = seen.max()
        column = int(cols[np.argmax(seen == top)]) if top > -INF else 0
        with np.errstate(all="ignore"):
            mass = np.exp(seen - top)[seen > -INF].sum() if top > -INF else 0.0
        lanes = seen.reshape(-1, block).max(axis=0)
        results = [run_pass(logits.to(DEVICE), lo, span, vocab, block, running)
                   for running in (False, True)]
        for got_nan, got_max, got_col, got_mass, got_lanes in results:
            assert (got_nan, got_max, got_col) == (nan, top, column), kind
            np.testing.assert_array_equal(got_lanes.view(np.float32), lanes, err_msg=kind)
            if kind == "plus_inf":  # inf - inf: both passes report a NaN mass
                assert np.isnan(got_mass), kind
            else:
                assert abs(got_mass - mass) <= 1e-5 * max(1.0, mass), (kind, got_mass, mass)
