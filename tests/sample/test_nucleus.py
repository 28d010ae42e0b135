"""The split nucleus draw's pivots (`graphshard.sample.nucleus.knot_pivots`): top-p rows whose
logit tails are Gaussian, Gumbel or heavy (Student t), cold and warm, each drawn by 16 finish
programs, equal the float64 reference, and every one is split (its threshold's interval short
enough to sort). With the pivots drawn from the floor to the row maximum alone
(`candidates.mass_pivots`), 3 of these 12 rows were not: the cold Gaussian rows and the cold
Gumbel row, whose threshold's interval held more than 256 pool entries."""

import math

import numpy as np
import pytest
import torch

from graphshard.sample import kernels as sampler
from graphshard.sample import nucleus
from graphshard.sample.params import SamplingParams
from tests.sample.test_sampler import (DEVICE, NO_SLOW_PATHS, assert_same, make_batch, run_kernel,
                                       run_ref)

VOCAB, CHUNK = 16000, 1024  # 16 chunks: the pivots take their knot from the chunk maxima


def test_knot_is_a_middle_rank_of_the_chunk_maxima():
    assert nucleus.knot_rank(19) == 16
    assert nucleus.knot_count(19) == pytest.approx(-19 * math.log(2.5 / 19))  # ~38.5
    assert nucleus.knot_rank(16) == 13
    assert nucleus.knot_rank(4) == -1  # few chunks: the row maximum alone, as before


def test_top_p_rows_of_every_tail_shape_are_split():
    rs = np.random.default_rng(5)
    tails = [lambda: rs.standard_normal(VOCAB) * 3, lambda: rs.standard_t(4, VOCAB) * 2,
             lambda: rs.gumbel(size=VOCAB) * 2]
    params, rows = [], []
    for draw in tails:
        for temperature, top_p in [(0.5, 0.9), (0.8, 0.9), (0.6, 0.5), (1.0, 0.95)]:
            params.append(SamplingParams(temperature=temperature, top_p=top_p, seed=len(params)))
            rows.append(draw())
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(np.stack(rows).astype(np.float32))
    ws = sampler.SamplerWorkspace.allocate(len(params), 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=0, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=16)
    assert_same(records, layout, run_ref(b, K=0, vocab_size=VOCAB))
    assert ws.paths() == NO_SLOW_PATHS
    assert ws.split_draws() == len(params)
