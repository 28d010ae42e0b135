"""The deep nucleus draw (`graphshard.sample.deep`): a top-p row whose nucleus reaches below its
pool, and whose unfiltered Gumbel winner lies outside the nucleus (the count over the row that
checks that winner rejects it), settles by a few weighing passes over the row, equal to the
float64 reference: with one finish program per row and with 16, with a bitmask and with
logprobs. Rows whose winner the check accepts, and rows of thousands of ties at the threshold,
settle by the check alone: over the pool when the winner lies above every floor, over the row
otherwise."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from graphshard.sample import kernels as sampler, rng
from graphshard.sample.candidates import PIVOTS, SORT_LIMIT
from graphshard.sample.deep import DENSE, REACH, STEP, first_offsets
from graphshard.sample.params import SamplingParams
from graphshard.sample.reference import kept_mask
from tests.sample.test_sampler import (DEVICE, NO_SLOW_PATHS, assert_same, full_bitmask,
                                       make_batch, run_kernel, run_ref, set_allowed)

VOCAB, CHUNK = 16000, 1024  # 16 chunks of 128 captured candidates: pools of ~2000


def winner_kept(row, temperature, top_p, seed, position, allowed=None) -> bool:
    """Whether the unfiltered Gumbel-max token of `row` under `seed` lies in its nucleus (the
    reference's scores and noise)."""
    s = row.astype(np.float64) / temperature
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    key = rng.row_key_np(*rng.split_seed(seed), position)
    return bool(kept_mask(s, 0, top_p, 0.0)[np.argmax(s + rng.gumbel_np(key, np.arange(s.size)))])


def with_seed(b, i, kept: bool, allowed=None, vocab=VOCAB):
    """Give request i (a one-row request) the first seed from 1000 whose unfiltered winner is
    kept (or not), so that the row's path is known."""
    p = b.params[i]
    row = b.logits[i, :vocab].float().numpy()
    seed = next(s for s in range(1000, 2000)
                if winner_kept(row, p.temperature, p.top_p, s, b.seq_lens[i], allowed) == kept)
    b.params[i] = SamplingParams(temperature=p.temperature, top_p=p.top_p, seed=seed,
                                 num_logprobs=p.num_logprobs)


def _two_blocks(rs, gap):
    """2100 scores near 6 over 13900 near 6 - gap: a nucleus of 0.9 that ends in the low block,
    `gap` below the pool's floor (past the first pass's pivots when gap > 3.5)."""
    row = np.concatenate([6 + rs.standard_normal(2100) * 0.05,
                          6 - gap + rs.standard_normal(VOCAB - 2100) * 0.05])
    return rs.permutation(row)


def _rows(rs):
    """(temperature, top_p, logits row, whether its unfiltered winner is kept) of each row."""
    gauss = lambda: rs.standard_normal(VOCAB) * 3  # noqa: E731
    return [
        # Gaussian rows past the pool: the first pass finds an interval that fits a sort, or
        # one more pass at pivots inside it.
        (1.5, 0.9, gauss(), False),
        (1.2, 0.95, gauss(), False),
        (2.5, 0.95, gauss(), False),
        # A uniform row (no tail at all): the nucleus is half the row.
        (1.0, 0.9, rs.uniform(0, 4, VOCAB), False),
        # The threshold 3.8 below the floor (a pass below the first's pivots), in a block of
        # 13900 close scores (passes at pivots inside a full interval).
        (1.0, 0.9, _two_blocks(rs, 3.8), False),
        # A winner the check accepts.
        (1.5, 0.9, gauss(), True),
        # Every score equal: the nucleus is every token, tied at the threshold.
        (1.0, 0.9, np.full(VOCAB, 0.5), True),
    ]


@pytest.mark.parametrize("programs", [1, 16])
def test_deep_nucleus_rows_equal_the_reference(programs):
    rs = np.random.default_rng(60 + programs)
    rows = _rows(rs)
    b = make_batch(rs, [SamplingParams(temperature=t, top_p=p) for t, p, _, _ in rows])
    b.logits = torch.from_numpy(np.stack([r for _, _, r, _ in rows]).astype(np.float32))
    for i, (_, _, _, kept) in enumerate(rows):
        with_seed(b, i, kept)
    ws = sampler.SamplerWorkspace.allocate(len(rows), 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=0, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=programs)
    assert_same(records, layout, run_ref(b, K=0, vocab_size=VOCAB))
    # Every row's pool falls short, so every row's winner is checked: by the pool's mass above
    # it where it lies above every floor (the kept Gaussian row's), by a count over the row
    # otherwise.
    assert ws.pool_checks() == 1
    if programs == 1:
        deep = sum(not kept for _, _, _, kept in rows)
        assert ws.paths() == dict(NO_SLOW_PATHS, counted=len(rows) - 1, deep=deep)
    else:
        # The five rows whose winner lies below every floor are weighed by their 16 programs
        # (`deep_split`); two of them go on in one program, to copy the threshold's interval or
        # weigh it again (`deep`), and the three others' winners above the interval settle them.
        # The row of equal scores overflows its pool: a count over the row.
        assert ws.paths() == dict(NO_SLOW_PATHS, counted=1, deep=2, deep_split=5)


def test_deep_rows_settle_in_their_programs_round_or_by_a_copy():
    """Gaussian rows at temperatures 1.3 to 2, winners outside the nucleus, 16 finish programs:
    every row is weighed by its programs (`deep_split`). Six settle there (the best Gumbel score
    above the threshold's interval beats the interval); two have an interval that fits the copy
    (662 and 756 tokens) with a better score inside it, and are copied without the RNG and
    sorted by one program (`deep`), with no further round. All equal the reference."""
    rs = np.random.default_rng(5)
    temps = [1.4, 1.5, 1.6, 1.8, 1.3, 1.5, 1.7, 2.0]
    b = make_batch(rs, [SamplingParams(temperature=t, top_p=0.9) for t in temps])
    b.logits = torch.from_numpy((rs.standard_normal((8, VOCAB)) * 3).astype(np.float32))
    for i in range(8):
        with_seed(b, i, False)
    ws = sampler.SamplerWorkspace.allocate(8, 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=0, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=16)
    assert_same(records, layout, run_ref(b, K=0, vocab_size=VOCAB))
    assert ws.paths() == dict(NO_SLOW_PATHS, deep=2, deep_split=8)


def test_deep_nucleus_with_bitmask_and_logprobs():
    """A bitmask that allows every other token, and 5 logprobs from the pool the draw's copy
    lies behind: both equal the reference."""
    rs = np.random.default_rng(70)
    params = [SamplingParams(temperature=1.5, top_p=0.9, num_logprobs=5),
              SamplingParams(temperature=1.5, top_p=0.9)]
    mask = full_bitmask(2, VOCAB)
    set_allowed(mask[1], range(0, VOCAB, 2))
    b = make_batch(rs, params, bitmask=mask, bitmask_rows=np.array([0, 1], dtype=np.int32))
    b.logits = torch.from_numpy((rs.standard_normal((2, VOCAB)) * 3).astype(np.float32))
    with_seed(b, 0, False)
    with_seed(b, 1, False, allowed=np.arange(VOCAB) % 2 == 0)
    ws = sampler.SamplerWorkspace.allocate(2, 1, VOCAB, DEVICE, chunk_size=CHUNK)
    records, layout = run_kernel(b, K=5, vocab_size=VOCAB, block_size=1024, workspace=ws,
                                 finish_programs=16)
    assert_same(records, layout, run_ref(b, K=5, vocab_size=VOCAB))
    # Both rows weighed by their programs; one goes on to copy its threshold's interval.
    assert ws.paths() == dict(NO_SLOW_PATHS, deep=1, deep_split=2)


def kept_winner_batch(rs, vocab, padded):
    """Warm top-p rows over the full vocabulary (nuclei of thousands of tokens, past pools of
    ~2400) with seeds whose unfiltered winner the nucleus keeps; no logprobs (a sampled token's
    rank may be counted over the row too)."""
    b = make_batch(rs, [SamplingParams(temperature=t, top_p=0.9) for t in [1.0, 1.2, 1.5, 1.0] * 2])
    b.logits = torch.from_numpy(rs.standard_normal((8, padded)).astype(np.float32)) * 3
    for i in range(8):
        with_seed(b, i, True, vocab=vocab)
    return b


def assert_winners_checked(ws, rows, programs):
    """Every row settled by the winner's check (none by the deep draw), over the pool for some
    rows and over the row for others: a count in one program, or with several programs the
    row's weighing by all of them (`deep_split`), whose intervals answer the check."""
    paths = ws.paths()
    assert paths["deep"] == 0 and paths["draw_fallback"] == 0, paths
    taken, other = ("counted", "deep_split") if programs == 1 else ("deep_split", "counted")
    assert paths[other] == 0, paths
    by_row = paths[taken]
    assert ws.pool_checks() + by_row == rows, (ws.pool_checks(), paths)
    assert ws.pool_checks() > 0 and by_row > 0, (ws.pool_checks(), paths)


@pytest.mark.parametrize("programs", [1, 16])
def test_kept_winners_of_deep_nuclei_full_vocabulary(programs):
    """At V = 152064 a kept winner of a nucleus deeper than the pool lies above every floor in
    about two rows of three (checked over the pool) and below in the rest (checked over the
    row); both equal the reference."""
    vocab = 152064
    b = kept_winner_batch(np.random.default_rng(80 + programs), vocab, vocab)
    ws = sampler.SamplerWorkspace.allocate(8, 1, vocab, DEVICE)
    records, layout = run_kernel(b, K=0, vocab_size=vocab, block_size=None, workspace=ws,
                                 finish_programs=programs)
    assert_same(records, layout, run_ref(b, K=0, vocab_size=vocab))
    assert_winners_checked(ws, 8, programs)


@triton.jit
def _offsets_kernel(pool_x, pool_id, n_pool, start, out, CAP: tl.constexpr, TILE: tl.constexpr):
    tl.store(out + tl.arange(0, PIVOTS), first_offsets(pool_x, pool_id, n_pool, 1.0, start, CAP,
                                                       TILE))


def _first_offsets(pool: np.ndarray, start: float, cap: int = 4096) -> np.ndarray:
    pool_x = torch.zeros(cap, dtype=torch.int32, device=DEVICE)
    pool_x[:pool.size] = torch.from_numpy(pool.astype(np.float32)).view(torch.int32).to(DEVICE)
    pool_id = torch.arange(cap, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(PIVOTS.value, dtype=torch.float32, device=DEVICE)
    _offsets_kernel[(1,)](pool_x, pool_id, pool.size, start, out, CAP=cap, TILE=1024)
    return out.cpu().numpy()


def test_first_pivots_follow_the_rows_density():
    """The first weighing pass's pivots (`deep.first_offsets`) on a warm row's pool: they rise
    from the pool's floor, reach REACH below it, and each of the DENSE intervals nearest the
    floor holds at most what the copy sorts; a pool that gives no rate (empty, or every entry
    one value) falls back to even steps of STEP."""
    s = np.random.default_rng(0).standard_normal(152064) * 3.0  # temperature 1
    ranked = np.sort(s)[::-1]
    start = float(ranked[2099])
    offsets = _first_offsets(ranked[:2400], start)
    finite = PIVOTS.value - 1
    assert offsets[0] == 0.0 and np.all(np.diff(offsets[:finite]) > 0)
    assert offsets[finite - 1] == pytest.approx(REACH.value, abs=1e-5)
    counts = [(s >= start - o).sum() for o in offsets[:DENSE.value]]
    assert 0 < max(np.diff(counts)) <= SORT_LIMIT.value
    even = np.arange(PIVOTS.value, dtype=np.float32) * np.float32(STEP.value)
    np.testing.assert_array_equal(_first_offsets(ranked[:0], start), even)
    np.testing.assert_array_equal(_first_offsets(np.full(100, start), start), even)
