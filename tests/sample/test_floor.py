"""A chunk's capture floor on adversarial lane maxima: the radix search of a chunk that starts
first (`floors.chunk_floor`), and the one-pass refinement of a cut the row's earlier chunks
published (`floors.refine_floor`), chosen as the scan chooses them. Whatever the lanes (ties, -inf, +inf, a single finite value) and wherever the
published cut lies, the floor is a valid one: `need` lanes reach it, or it is the published cut.
And the sharing itself: a chunk that publishes its floor (`share_floor`) gets back the largest
value published so far, and one that reads the row's cut (`published_cut`) sees the largest
published before it.

Runs under the Triton interpreter on CPU (TRITON_INTERPRET=1) or compiled on a CUDA device.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from graphshard.sample.floors import (FLOOR_PIVOTS, chunk_floor, published_cut, refine_floor,
                                      share_floor)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a CUDA device")
LANES = 256
PASSES, RADIX_BITS = 4, 4


@triton.jit
def _floor_kernel(lanes_ptr, need_ptr, low_ptr, out_ptr, LANES: tl.constexpr,
                  PASSES: tl.constexpr, RADIX_BITS: tl.constexpr):
    lane_max = tl.load(lanes_ptr + tl.arange(0, LANES))  # [LANES]
    need = tl.load(need_ptr)
    low = tl.load(low_ptr)
    if low > float("-inf"):
        floor = refine_floor(lane_max, need, low, tl.max(lane_max, axis=0))
    else:
        floor = chunk_floor(lane_max, need, LANES, PASSES, RADIX_BITS)
    tl.store(out_ptr, floor)


def run_floor(lanes: np.ndarray, need: int, low: float) -> float:
    out = torch.empty(1, dtype=torch.float32, device=DEVICE)
    _floor_kernel[(1,)](torch.from_numpy(lanes.astype(np.float32)).to(DEVICE),
                        torch.tensor([need], dtype=torch.int32, device=DEVICE),
                        torch.tensor([low], dtype=torch.float32, device=DEVICE), out,
                        LANES=LANES, PASSES=PASSES, RADIX_BITS=RADIX_BITS, num_warps=4)
    return float(out.cpu()[0])


LANE_KINDS = ["normal", "ties", "all_neg_inf", "single", "pos_inf", "two_values"]


def make_lanes(rs, kind: str) -> np.ndarray:
    x = (rs.standard_normal(LANES) * 3).astype(np.float32)
    if kind == "ties":
        x[rs.choice(LANES, LANES // 2, replace=False)] = np.float32(rs.normal())
    elif kind == "all_neg_inf":
        x[:] = -np.inf
    elif kind == "single":
        x[:] = -np.inf
        x[rs.integers(LANES)] = np.float32(rs.normal())
    elif kind == "pos_inf":
        x[rs.choice(LANES, 3, replace=False)] = np.inf
    elif kind == "two_values":
        x = np.where(rs.random(LANES) < 0.5, np.float32(1.0), np.float32(-2.0))
    return x


def low_for(rs, lanes: np.ndarray, where: str) -> float:
    finite = lanes[np.isfinite(lanes)]
    lo, hi = (finite.min(), finite.max()) if finite.size else (-1.0, 1.0)
    return {"none": np.nan, "neg_inf": -np.inf, "below": lo - 1.0, "inside": rs.uniform(lo, hi),
            "at_max": hi, "above": hi + 5.0}[where]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(LANE_KINDS),
       where=st.sampled_from(["none", "neg_inf", "below", "inside", "at_max", "above"]),
       need=st.sampled_from([1, 2, 5, 50, 64, 255, 256, 257]))
def test_floor_is_reached_by_need_lanes_or_is_the_published_cut(seed, kind, where, need):
    rs = np.random.default_rng(seed)
    lanes = make_lanes(rs, kind)
    low = np.float32(low_for(rs, lanes, where))
    floor = np.float32(run_floor(lanes, need, float(low)))
    assert not np.isnan(floor)
    reached = int((lanes >= floor).sum())
    if low > -np.inf:
        # A published cut is kept or raised, and only to a value `need` lanes reach.
        assert floor >= low
        assert floor == low or reached >= need
        if floor > low:
            assert floor <= np.sort(lanes)[::-1][need - 1]
    elif need > LANES:
        assert floor == -np.inf
    else:
        exact = np.sort(lanes)[::-1][need - 1]
        assert reached >= need and floor <= exact
        # Four radix digits decide the top 16 bits of the order key: within 1% of the exact value.
        if np.isfinite(exact) and exact != 0:
            assert abs(floor - exact) <= 0.01 * abs(exact) + 1e-30


def test_refined_floor_rises_to_the_last_pivot_need_lanes_reach():
    """Lanes 0..255 and a published cut of 100: the cut rises to the last of the pivots
    100 + j * (255 - 100) / FLOOR_PIVOTS (fp32, as the kernel rounds them) that 50 lanes reach."""
    lanes = np.arange(LANES, dtype=np.float32)
    floor = run_floor(lanes, 50, 100.0)
    n = FLOOR_PIVOTS.value
    step = np.float32(255.0 - 100.0) / np.float32(n)
    pivots = np.float32(100.0) + step * np.arange(n, dtype=np.float32)
    reached = pivots[np.array([(lanes >= p).sum() >= 50 for p in pivots])]
    assert floor == reached.max() > 100.0 and (lanes >= floor).sum() >= 50
    assert (lanes >= floor + step).sum() < 50


@triton.jit
def _share_kernel(fill_ptr, values_ptr, seen_ptr, shared_ptr):
    """Each program reads the row's cut, then publishes its own value (as a chunk does)."""
    i = tl.program_id(0)
    tl.store(seen_ptr + i, published_cut(fill_ptr))
    tl.store(shared_ptr + i, share_floor(fill_ptr, tl.load(values_ptr + i)))


def _as_floats(keys: np.ndarray) -> np.ndarray:
    """Order keys (uint32) -> the floats they order (`rows.key_to_float`)."""
    keys = keys.astype(np.uint32)
    bits = np.where(keys >> 31 != 0, keys ^ np.uint32(0x80000000), keys ^ np.uint32(0xFFFFFFFF))
    return bits.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("kind", ["normal", "ties", "with_neg_inf"])
def test_chunks_see_the_largest_floor_published_before_them(kind):
    rs = np.random.default_rng(7)
    values = (rs.standard_normal(64) * 3).astype(np.float32)
    if kind == "ties":
        values[::3] = np.float32(1.5)
    elif kind == "with_neg_inf":
        values[rs.choice(64, 20, replace=False)] = -np.inf
    fill = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    seen_dev = torch.empty(64, dtype=torch.float32, device=DEVICE)
    shared_dev = torch.empty_like(seen_dev)
    _share_kernel[(64,)](fill, torch.from_numpy(values).to(DEVICE), seen_dev, shared_dev,
                         num_warps=4)
    seen, shared = seen_dev.cpu().numpy(), shared_dev.cpu().numpy()
    # The word after the fill holds the largest value as an order key.
    assert _as_floats(fill.cpu().numpy()[1:].view(np.uint32))[0] == values.max()
    # Each program gets back at least its own value, and only a value some program published.
    assert (shared >= values).all() and np.isin(shared, values).all()
    if INTERPRET:
        # Programs run one after another: each sees exactly the values before it (NaN: none).
        before = np.maximum.accumulate(values)
        assert np.isnan(seen[0]) and np.array_equal(seen[1:], before[:-1])
        assert np.array_equal(shared, before)
    else:
        # Programs run concurrently: each sees nothing yet (NaN) or a published value, never
        # more than what its own publish then returns (the word only grows).
        assert (np.isnan(seen) | np.isin(seen, values)).all()
        assert (np.isnan(seen) | (seen <= shared)).all()
    # Once every program has published, a later chunk reads the largest value, and publishing
    # a smaller one gets the largest back.
    later = np.full(64, values.min() - np.float32(1.0), np.float32)
    seen, shared = torch.empty_like(seen_dev), torch.empty_like(seen_dev)
    _share_kernel[(64,)](fill, torch.from_numpy(later).to(DEVICE), seen, shared, num_warps=4)
    assert (seen.cpu().numpy() == values.max()).all()
    assert (shared.cpu().numpy() == values.max()).all()
