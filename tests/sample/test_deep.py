"""The deep nucleus draw (`graphshard.sample.deep`): top-p rows whose nucleus reaches below their
pool settle by a few weighing passes over the row, equal to the float64 reference, with one
finish program per row and with 16, with a bitmask and with logprobs; rows the passes cannot
settle (thousands of ties at the threshold) take the whole-row paths, still equal."""

import numpy as np
import pytest
import torch

from graphshard.sample import kernels as sampler
from graphshard.sample.params import SamplingParams
from tests.sample.test_sampler import (DEVICE, NO_SLOW_PATHS, assert_same, full_bitmask,
                                       make_batch, run_kernel, run_ref, set_allowed)

VOCAB, CHUNK = 16000, 1024  # 16 chunks of 128 captured candidates: pools of ~2000


def _two_blocks(rs, gap):
    """2100 scores near 6 over 13900 near 6 - gap: a nucleus of 0.9 that ends in the low block,
    `gap` below the pool's floor (past the first pass's pivots when gap > 3.5)."""
    row = np.concatenate([6 + rs.standard_normal(2100) * 0.05,
                          6 - gap + rs.standard_normal(VOCAB - 2100) * 0.05])
    return rs.permutation(row)


def _rows(rs):
    """(params, logits row, the path that settles it) of each test row."""
    gauss = lambda: rs.standard_normal(VOCAB) * 3  # noqa: E731
    return [
        # Gaussian rows past the pool: the first pass finds an interval that fits a sort, or
        # one more pass at pivots inside it.
        (SamplingParams(temperature=1.5, top_p=0.9, seed=1), gauss(), "deep"),
        (SamplingParams(temperature=1.2, top_p=0.95, seed=2), gauss(), "deep"),
        (SamplingParams(temperature=2.5, top_p=0.95, seed=3), gauss(), "deep"),
        # A uniform row (no tail at all): the nucleus is half the row.
        (SamplingParams(temperature=1.0, top_p=0.9, seed=4), rs.uniform(0, 4, VOCAB), "deep"),
        # The threshold 3.8 below the floor (a pass below the first's pivots), in a block of
        # 13900 close scores (passes at pivots inside a full interval).
        (SamplingParams(temperature=1.0, top_p=0.9, seed=5), _two_blocks(rs, 3.8), "deep"),
        # Every score equal: the nucleus is every token, tied at the threshold; no interval
        # between pivots fits a sort, and a count over the row proves the unfiltered winner.
        (SamplingParams(temperature=1.0, top_p=0.9, seed=6), np.full(VOCAB, 0.5), "counted"),
    ]


@pytest.mark.parametrize("programs", [1, 16])
def test_deep_nucleus_rows_equal_the_reference(programs):
    rs = np.random.default_rng(60 + programs)
    rows = _rows(rs)
    params = [p for p, _, _ in rows]
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(np.stack([r for _, r, _ in rows]).astype(np.float32))
    ws = sampler.SamplerWorkspace.allocate(len(params), 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=0, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=programs)
    assert_same(records, layout, run_ref(b, K=0, vocab_size=VOCAB))
    want = dict(NO_SLOW_PATHS)
    for _, _, path in rows:
        want[path] += 1
    assert ws.paths() == want


def test_deep_nucleus_with_bitmask_and_logprobs():
    """A bitmask that allows every other token, and 5 logprobs from the pool the draw's copy
    lies behind: both equal the reference."""
    rs = np.random.default_rng(70)
    params = [SamplingParams(temperature=1.5, top_p=0.9, seed=7, num_logprobs=5),
              SamplingParams(temperature=1.5, top_p=0.9, seed=8)]
    mask = full_bitmask(2, VOCAB)
    set_allowed(mask[1], range(0, VOCAB, 2))
    b = make_batch(rs, params, bitmask=mask, bitmask_rows=np.array([0, 1], dtype=np.int32))
    b.logits = torch.from_numpy((rs.standard_normal((2, VOCAB)) * 3).astype(np.float32))
    ws = sampler.SamplerWorkspace.allocate(2, 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=5, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=16)
    assert_same(records, layout, run_ref(b, K=5, vocab_size=VOCAB))
    paths = ws.paths()
    assert paths["deep"] == 2
    assert paths["draw_fallback"] == 0 and paths["logprobs_fallback"] == 0
