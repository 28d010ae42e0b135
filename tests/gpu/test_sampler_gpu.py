"""The sampler at full vocabulary on a GPU: benchmark settings settle from their candidates, and
adversarial rows equal the float64 reference whichever path settles them."""

import numpy as np
import pytest
import torch

from graphshard.sample import grid, kernels as sampler
from graphshard.sample.params import SamplingParams
from tests.sample.test_deep import assert_winners_checked, kept_winner_batch, with_seed
from tests.sample.test_sampler import NO_SLOW_PATHS, ROW_KINDS, adversarial_batch, make_batch, \
    min_p_batch, run_kernel, run_ref, assert_same

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

V, PV = 152064, 152064
SETTINGS = {
    "temperature": SamplingParams(temperature=0.8, seed=1),
    "top_k": SamplingParams(temperature=0.8, top_k=50, seed=2),
    "top_p": SamplingParams(temperature=0.8, top_p=0.9, seed=3),
    "top_p_cold": SamplingParams(temperature=0.5, top_p=0.9, seed=8),
    "top_k_top_p": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=4),
    "min_p": SamplingParams(temperature=0.8, min_p=0.05, seed=5),
    "greedy_logprobs_20": SamplingParams(temperature=0.0, num_logprobs=20),
    "top_k_top_p_logprobs_5": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=6,
                                             num_logprobs=5),
}


def run_setting(name: str, dtype: torch.dtype, n: int, device: str):
    """One benchmark setting over n rows of `randn * 3` at full vocabulary, checked against the
    reference; returns the workspace (its paths and split draws)."""
    rs = np.random.default_rng(len(name))
    b = make_batch(rs, [SETTINGS[name]] * n, dtype=dtype)
    b.logits = (torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32)) * 3).to(dtype)
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, device)
    records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws)
    assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    return ws


def settings_batch(seed: int, dtype: torch.dtype):
    """Every benchmark setting, 8 rows each, over `randn * 3` at full vocabulary -> (the
    generator, for what the caller draws next; the batch)."""
    rs = np.random.default_rng(seed)
    params = [p for p in SETTINGS.values() for _ in range(8)]
    b = make_batch(rs, params, dtype=dtype)
    b.logits = (torch.from_numpy(rs.standard_normal((len(params), PV)).astype(np.float32))
                * 3).to(dtype)
    return rs, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_benchmark_settings_settle_from_candidates(name, dtype):
    n = 48
    ws = run_setting(name, dtype, n, "cuda")
    assert ws.paths() == NO_SLOW_PATHS
    # 48 rows take 16 finish programs each: every top-p pool (~2400 entries) is split. The cold
    # rows' thresholds lie in the top intervals of the pivots, where a Gaussian tail still puts
    # more entries than the knot's count curve: on CPU (interpreter), 46 of these 48 rows are
    # split, and 26 with the pivots of `candidates.mass_pivots` (the shared cut's races make a
    # GPU's pools differ by a few entries).
    split = ws.split_draws()
    if name == "top_p":
        assert split == n
        # The best score above the threshold's interval beats the interval's in most rows
        # (47 of 48 on CPU), which then skip the interval's gather and sort.
        assert ws.split_draws_beaten() >= n // 2, ws.split_draws_beaten()
    elif name == "top_p_cold":
        assert split >= n - 6, split
    else:
        assert split == 0


def test_repeated_top_p_launches_leave_no_pool_word_set():
    """32 top-p rows (16 finish programs each, two waves of them on an H100), their unfiltered
    winners outside the nucleus (so below most pools' floors) and their top-p set so that most
    pools' mass lies within a few percent of the target, launched 100 times into one workspace:
    every launch leaves every pool word at zero (`run_kernel` checks), no row falls back, and
    the tokens equal the reference. Before the row's programs took one answer to whether the
    pool falls short (`nucleus.agree_wide`), a program summing a pool that another was
    reordering could take the other path, the row's arrival count never completed, and its word
    stayed set: every later launch fell back (BENCHMARKS.md, "A top-p row's pool word left
    set": at the 3rd launch of one run of the benchmark's top-p setting on an H100, and the
    100th of another)."""
    n = 32
    rs = np.random.default_rng(11)
    params = [SamplingParams(temperature=0.8, top_p=float(p), seed=i)
              for i, p in enumerate(np.linspace(0.92, 0.945, n))]
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32) * 3)
    for i in range(n):
        with_seed(b, i, kept=False, vocab=V)
    want = run_ref(b, K=20, vocab_size=V)
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
    for _ in range(100):
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws)
        assert_same(records, layout, want)
    assert ws.paths()["draw_fallback"] == 0


@pytest.mark.parametrize("programs", [1, 16])
def test_split_nucleus_draw_full_vocabulary(programs):
    """Top-p rows alone and with logprobs, drawn with 1 and 16 finish programs per row, twice
    into one workspace (the pool word's arrival counts reset), equal the reference; with 16,
    every row is split (a pool of ~2400 entries spans 10 slices of 256). Temperatures and top-p
    keep each nucleus inside the pool, so no row needs a whole-row pass. (With the pivots of
    `candidates.mass_pivots`, the rows at temperature 0.5 / top-p 0.9 and 0.7 / 0.8 were not
    split: the threshold's interval held ~300 entries.)"""
    rs = np.random.default_rng(40 + programs)
    n = 8
    params = [SamplingParams(temperature=t, top_p=p, seed=i, num_logprobs=i % 3)
              for i, (t, p) in enumerate(zip([0.8, 0.6, 0.5, 0.7] * 2,
                                             [0.9, 0.5, 0.9, 0.8, 0.7, 0.3, 0.85, 0.6]))]
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32)) * 3
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
    for _ in range(2):
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                     finish_programs=programs)
        assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    assert ws.paths() == NO_SLOW_PATHS
    assert ws.split_draws() == (0 if programs == 1 else 2 * n)


@pytest.mark.parametrize("programs", [1, 16])
def test_deep_nucleus_full_vocabulary(programs):
    """Warm top-p rows (temperatures 1 to 2.5: nuclei of ~6000 to most of 152064 tokens, past
    pools of ~2400), some with logprobs, with seeds whose unfiltered winner lies outside the
    nucleus, twice into one workspace: every draw settles by the deep nucleus draw's passes over
    the row (`graphshard.sample.deep`; its first round by all 16 programs of the row with 16,
    `deep_split`), equal to the reference. Before it, such a row took the
    one-program radix search (2.3-2.7 ms on an H200)."""
    rs = np.random.default_rng(50 + programs)
    n = 8
    params = [SamplingParams(temperature=t, top_p=p, num_logprobs=i % 3)
              for i, (t, p) in enumerate(zip([1.0, 1.5, 2.5, 1.2] * 2,
                                             [0.9, 0.9, 0.95, 0.95, 0.95, 0.9, 0.99, 0.9]))]
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32)) * 3
    for i in range(n):
        with_seed(b, i, False, vocab=V)
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
    for _ in range(2):
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                     finish_programs=programs)
        assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    paths = ws.paths()
    assert paths["draw_fallback"] == 0, paths
    if programs == 1:
        assert paths["deep"] == 2 * n and paths["deep_split"] == 0, paths
    else:
        # Every row weighed by its 16 programs first; some go on to the one-program passes.
        assert paths["deep_split"] == 2 * n and paths["deep"] <= 2 * n, paths


@pytest.mark.parametrize("programs", [1, 16])
def test_kept_winners_of_deep_nuclei_full_vocabulary(programs):
    """`tests/sample/test_deep.py`'s rows on a GPU, with 20 logprob slots in the layout, twice
    into one workspace: the winner's check settles every row, over the pool or over the row,
    equal to the reference."""
    b = kept_winner_batch(np.random.default_rng(80 + programs), V, PV)
    ws = sampler.SamplerWorkspace.allocate(8, 1, V, "cuda")
    for _ in range(2):
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                     finish_programs=programs)
        assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    assert_winners_checked(ws, 16, programs)


@pytest.mark.parametrize("name", ["top_k_top_p", "greedy_logprobs_20", "top_p"])
def test_large_batches_settle_from_candidates(name):
    """64 rows (every slot): 1216 chunk programs, more than one H200 runs at once, so the later
    chunks of a row refine the cut it published instead of searching (and, racing the publishes,
    once read different cuts in different threads of one program)."""
    rs = np.random.default_rng(7 + len(name))
    n = 64
    b = make_batch(rs, [SETTINGS[name]] * n)
    b.logits = torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32)) * 3
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
    for _ in range(3):
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws)
    assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    assert ws.paths() == NO_SLOW_PATHS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_top_p_batches_race_their_draws(dtype):
    """1024 top-p rows: one finish program a row, whose pools (~2400 entries) are searched by
    mass; the race of `candidates.search_mass` draws some of them without sorting the
    threshold's interval, and every token still equals the reference. (At 1024 rows the race
    took a fifth off the finish on an H100; at 256 it changed little: most of those pools fit
    the two-tile sort and never reach the mass search.)"""
    ws = run_setting("top_p", dtype, 1024, "cuda")
    assert ws.paths() == NO_SLOW_PATHS
    assert ws.split_draws() == 0
    assert ws.pool_draws_raced() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunks_per_program_change_no_result_full_vocabulary(dtype):
    """Every benchmark setting in one batch, sampled with one and with two vocabulary chunks per
    scan program (the large-batch default): the same record words, equal to the reference, all
    settled from candidates."""
    _, b = settings_batch(13, dtype)
    n = len(b.params)
    results = []
    for group in (1, 2):
        ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                     splits_per_program=group)
        results.append(records)
        assert ws.paths() == NO_SLOW_PATHS, group
    assert torch.equal(results[0], results[1])
    assert_same(results[0], layout, run_ref(b, K=20, vocab_size=V))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_capped_finish_changes_no_result_full_vocabulary(dtype, monkeypatch):
    """Every benchmark setting in one batch, settled by a one-program finish with all the
    registers it asks for and with a large batch's cap (FINISH_CAPPED_ROWS): the same record
    words, bit for bit, equal to the reference."""
    _, b = settings_batch(17, dtype)
    n = len(b.params)
    results = []
    for rows in (1 << 30, 1):
        monkeypatch.setattr(grid, "FINISH_CAPPED_ROWS", rows)
        assert ("maxnreg" in grid.finish_options(n, 1, 1024)) == (rows <= n)
        ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
        records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                     finish_programs=1)
        results.append(records)
        assert ws.paths() == NO_SLOW_PATHS, rows
    assert torch.equal(results[0], results[1])
    assert_same(results[0], layout, run_ref(b, K=20, vocab_size=V))


def test_capped_bitmask_finish_changes_no_result_full_vocabulary(monkeypatch):
    """The finish the engine launches (with bitmask support, ~170 registers uncapped) under the
    same cap: a step with the bitmask flag off (the unconstrained result) and one with a dense
    random mask on, each with the same record words capped and uncapped, equal to the reference.
    One dtype: the flag is read at run time, so both steps share the two compiles."""
    rs, b = settings_batch(19, torch.bfloat16)
    n = len(b.params)
    # About one token in sixteen disallowed: the rows keep most of their candidates.
    words = sampler.bitmask_words(V)
    dense = ~(rs.integers(0, 2**32, size=(n, words), dtype=np.uint64)
              & rs.integers(0, 2**32, size=(n, words), dtype=np.uint64)
              & rs.integers(0, 2**32, size=(n, words), dtype=np.uint64)
              & rs.integers(0, 2**32, size=(n, words), dtype=np.uint64))
    mask = dense.astype(np.uint32).view(np.int32)
    for enabled in (0, 1):
        results = []
        for rows in (1 << 30, 1):
            monkeypatch.setattr(grid, "FINISH_CAPPED_ROWS", rows)
            b.bitmask, b.bitmask_rows = mask, np.arange(n, dtype=np.int32)
            ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
            records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws,
                                         finish_programs=1, bitmask_enabled=enabled)
            results.append(records)
        # Every path is exact, so the words agree whichever path a row took (which rows leave
        # the pool can change between launches: a row's chunks publish their cut in a race).
        assert torch.equal(results[0], results[1]), enabled
        if not enabled:
            b.bitmask, b.bitmask_rows = None, None  # flag off: exactly the unconstrained result
        assert_same(results[0], layout, run_ref(b, K=20, vocab_size=V))


def test_temperature_logprobs_full_vocabulary():
    """Unfiltered random rows that report logprobs: the top-K list comes from a pool of ~5000
    candidates (256 a chunk, for the sampled token's rank). A token drawn below every floor has
    its rank counted over the row (`counted`); nothing else leaves the pool."""
    rs = np.random.default_rng(11)
    n = 48
    b = make_batch(rs, [SamplingParams(temperature=0.8, seed=7, num_logprobs=5)] * n)
    b.logits = torch.from_numpy(rs.standard_normal((n, PV)).astype(np.float32)) * 3
    ws = sampler.SamplerWorkspace.allocate(n, 1, V, "cuda")
    records, layout = run_kernel(b, K=20, vocab_size=V, block_size=None, workspace=ws)
    assert_same(records, layout, run_ref(b, K=20, vocab_size=V))
    paths = ws.paths()
    assert paths["draw_fallback"] == 0 and paths["logprobs_fallback"] == 0, paths


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_adversarial_rows_full_vocabulary(kind):
    rs = np.random.default_rng(sum(map(ord, kind)))
    for trial in range(3):
        b = adversarial_batch(rs, [kind] * 6, vocab=V, padded=PV)
        ws = sampler.SamplerWorkspace.allocate(6, 1, V, "cuda")
        records, layout = run_kernel(b, K=3, vocab_size=V, block_size=None, workspace=ws)
        assert_same(records, layout, run_ref(b, K=3, vocab_size=V))


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_min_p_rows_full_vocabulary(kind):
    """Min-p alone cuts at the row maximum with no floor search: every adversarial kind at full
    vocabulary, extreme temperatures, min-p from 1e-6 to 1."""
    rs = np.random.default_rng(sum(map(ord, kind)) + 1)
    b = min_p_batch(rs, kind, vocab=V, padded=PV)
    ws = sampler.SamplerWorkspace.allocate(4, 1, V, "cuda")
    records, layout = run_kernel(b, K=3, vocab_size=V, block_size=None, workspace=ws)
    assert_same(records, layout, run_ref(b, K=3, vocab_size=V))


def test_small_rows_at_large_grids_equal_the_reference():
    """V = 32000 (4 chunks): a grid of 256 rows takes one chunk per scan program and 192
    candidates per chunk (`kernels.chunk_top`), and a top-p row one finish program; its rows
    equal the reference. (On an H100 the tip's 128 per chunk sent ~1 % of such rows to the deep
    draw; BENCHMARKS.md.)"""
    vocab = 32000
    rs = np.random.default_rng(11)
    n = 64
    b = make_batch(rs, [SETTINGS["top_p"]] * n, dtype=torch.bfloat16)
    b.logits = (torch.from_numpy(rs.standard_normal((n, vocab)).astype(np.float32)) * 3
                ).to(torch.bfloat16)
    ws = sampler.SamplerWorkspace.allocate(256, 1, vocab, "cuda")
    records, layout = run_kernel(b, K=20, vocab_size=vocab, max_num_reqs=256, block_size=None,
                                 workspace=ws)
    assert_same(records, layout, run_ref(b, K=20, vocab_size=vocab))


if __name__ == "__main__":
    # `TRITON_INTERPRET=1 python -m tests.gpu.test_sampler_gpu top_p_cold` runs one setting's
    # rows on a CPU (about 80 s for 48 rows) and prints how they settled: a kernel change's
    # effect on the split counts above, before a GPU runs the test.
    import sys

    setting = sys.argv[1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ws = run_setting(setting, torch.float32, 48, device)
    print(setting, "fp32, 48 rows:", ws.paths(), "split", ws.split_draws(), "of them beaten",
          ws.split_draws_beaten())

