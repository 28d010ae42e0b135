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
import triton
import triton.language as tl

from graphshard.sample import kernels as sampler
from graphshard.sample import nucleus
from graphshard.sample.params import SamplingParams
from tests.sample.test_sampler import (DEVICE, NO_SLOW_PATHS, assert_same, make_batch, run_kernel,
                                       run_ref)

VOCAB, CHUNK = 16000, 1024  # 16 chunks: the pivots take their knot from the chunk maxima


@triton.jit
def _agree_kernel(fill_ptr, mine_ptr, out_ptr, ARRIVAL: tl.constexpr, PROGRAMS: tl.constexpr,
                  OPEN: tl.constexpr):
    """Each program arrives (as a finish program adds OPENED; without OPEN, the word holds
    every arrival already) and offers its own answer."""
    q = tl.program_id(0)
    if OPEN:
        word = tl.atomic_add(fill_ptr, ARRIVAL, sem="relaxed") + ARRIVAL
    else:
        word = tl.atomic_add(fill_ptr, 0, sem="relaxed")
    tl.store(out_ptr + q, nucleus.agree_wide(fill_ptr, word, tl.load(mine_ptr + q) != 0,
                                                    PROGRAMS))


def _agree(start: int, mine: list[bool], opened: bool = False) -> tuple[list[int], int]:
    """(each program's pool word after agreeing, the word left) from a word `start`, where
    every program has `opened` already or opens as it starts."""
    fill = torch.tensor([start], dtype=torch.int32, device=DEVICE)
    out = torch.zeros(len(mine), dtype=torch.int32, device=DEVICE)
    _agree_kernel[(len(mine),)](fill, torch.tensor(mine, dtype=torch.int32, device=DEVICE), out,
                                ARRIVAL=1 << nucleus.COUNT_BITS.value, PROGRAMS=len(mine),
                                OPEN=not opened)
    return out.tolist(), int(fill.item())


@pytest.mark.parametrize("mine", [[False, True, True, False], [True, False, False, False, False],
                                  [True] * 16, [False] * 16])
def test_the_rows_programs_take_one_answer_whatever_each_offers(mine):
    """The split finish's programs reorder a pool as soon as they know the row's path, so a
    program that weighed the pool later could answer otherwise; their arrival counts then never
    complete, and the pool word stays set for every later launch. One answer is published, the
    count the scan left is kept, and every program takes the answer."""
    count, arrival = 1234, 1 << nucleus.COUNT_BITS.value
    words, left = _agree(count, mine)
    decided, wide = nucleus.DECIDED.value, nucleus.WIDE.value
    answers = {w & wide != 0 for w in words}
    assert len(answers) == 1 and answers <= set(mine)
    assert all(w & decided for w in words)
    flag = decided | (wide if answers.pop() else 0)
    assert left == count + len(mine) * arrival | flag


@pytest.mark.parametrize("mine", [[True] * 4, [False, True, True]])
def test_the_answer_is_taken_when_every_program_opened_before_any_offers(mine):
    """The first swap expects every program opened: on a word that holds every arrival it
    publishes at once, and the word keeps the count and the arrivals. (Which program swaps
    first is the GPU's choice: the answer is one of those offered.)"""
    count, arrival = 4321, 1 << nucleus.COUNT_BITS.value
    start = count + len(mine) * arrival
    words, left = _agree(start, mine, opened=True)
    decided, wide = nucleus.DECIDED.value, nucleus.WIDE.value
    assert len(set(words)) == 1 and left == words[0]
    assert left & ~wide == start | decided and (left & wide != 0) in mine


@triton.jit
def _agree_after_reset_kernel(fill_ptr, seen, out_ptr, PROGRAMS: tl.constexpr):
    """A program that read the word as `seen` when it opened offers WIDE to a word since reset."""
    tl.store(out_ptr, nucleus.agree_wide(fill_ptr, seen, seen >= 0, PROGRAMS))


@pytest.mark.parametrize("opened", [1, 5, 16])
def test_a_program_deciding_after_the_reset_takes_the_answer_and_writes_nothing(opened):
    """Every program opened and every program with a slice arrived while this one was still
    summing the pool: the word is reset. It takes "not wide" and leaves the word at zero (a
    DECIDED written there would sit in the next launch's count word)."""
    fill = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    seen = 1234 + opened * (1 << nucleus.COUNT_BITS.value)
    _agree_after_reset_kernel[(1,)](fill, seen, out, PROGRAMS=16)
    assert int(out.item()) == nucleus.DECIDED.value and int(fill.item()) == 0


@pytest.mark.parametrize("published", [True, False])
def test_a_published_answer_stands(published):
    decided, wide = nucleus.DECIDED.value, nucleus.WIDE.value
    start = 77 | decided | (wide if published else 0)
    words, _ = _agree(start, [not published] * 4)
    assert {w & wide != 0 for w in words} == {published}


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
    # Both ways a split row settles: by the best score above the threshold's interval, or by
    # the interval's gather and sort (1 and 11 of these rows; their nuclei lie in the top
    # intervals, the rows of the benchmark settings' 48 at 152064 mostly beaten).
    assert 0 < ws.split_draws_beaten() < len(params), ws.split_draws_beaten()
