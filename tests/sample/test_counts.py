"""The finish's count over a row (`resolve.count_row`): the winner's check and a token's rank.
Four tiles a step (the finish's default) and one (the finish held to 64 registers) give the
same bits, with and without a bitmask, on a vocabulary that ends inside a step; the counts
equal NumPy's and the mass is within rounding of float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from graphshard.harness.workload import bitmask_from_allowed
from graphshard.sample.resolve import count_row

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _count_kernel(row_ptr, mask_ptr, out_ptr, mask_flag, inv_temp, v_s, max_s, v_r,
                  VOCAB: tl.constexpr, BLOCK: tl.constexpr, HAS_BITMASK: tl.constexpr,
                  TILES: tl.constexpr):
    mask_on = mask_flag != 0
    above, mass, raw_above = count_row(row_ptr, mask_ptr, mask_on, VOCAB, inv_temp, v_s, max_s,
                                       v_r, BLOCK, HAS_BITMASK, TILES)
    tl.store(out_ptr, above)
    tl.store(out_ptr + 1, mass.to(tl.int32, bitcast=True))
    tl.store(out_ptr + 2, raw_above)


def run_count(row, words, mask_on, inv_temp, v_s, max_s, v_r, block, tiles):
    out = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    _count_kernel[(1,)](row, words, out, int(mask_on), inv_temp, v_s, max_s, v_r,
                        VOCAB=row.numel(), BLOCK=block, HAS_BITMASK=words is not None,
                        TILES=tiles, num_warps=4, enable_fp_fusion=False)
    o = out.cpu().numpy()
    return int(o[0]), float(o[1:2].view(np.float32)[0]), int(o[2])


@pytest.mark.parametrize("bitmask", [False, True])
def test_four_tiles_a_step_count_as_one(bitmask):
    rs = np.random.default_rng(11 + bitmask)
    vocab, block = 3 * 4 * 128 + 200, 128  # three whole steps of four tiles, then part of one
    x = (rs.standard_normal(vocab) * 3).astype(np.float32)
    x[rs.choice(vocab, 40, replace=False)] = -np.inf
    x[rs.choice(vocab, 5, replace=False)] = np.nan
    allowed = rs.random(vocab) < 0.7 if bitmask else np.ones(vocab, bool)
    row = torch.from_numpy(x).to(DEVICE)
    words = bitmask_from_allowed(np.flatnonzero(allowed), vocab)
    mask = torch.from_numpy(words).to(DEVICE) if bitmask else None
    inv_temp, v_s, v_r = 1 / 0.7, 2.0, 1.5
    s = np.where(np.isnan(x) | ~allowed, -np.inf, x.astype(np.float64) * inv_temp)
    max_s = float(s.max())
    one = run_count(row, mask, bitmask, inv_temp, v_s, max_s, v_r, block, 1)
    four = run_count(row, mask, bitmask, inv_temp, v_s, max_s, v_r, block, 4)
    assert four == one
    above = s > v_s
    assert one[0] == int(above.sum())
    assert one[2] == int((np.nan_to_num(x, nan=-np.inf) > v_r).sum())
    assert one[1] == pytest.approx(float(np.exp(s[above] - max_s).sum()), rel=1e-5)
