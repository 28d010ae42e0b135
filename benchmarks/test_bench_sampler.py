"""Sampler GPU time per call inside a graph: every mode x batch x shape of the sampling targets.

Modes (`benchmarks.sampling_modes.MODES`): greedy, temperature, top-k 50, top-p 0.9, top-k 50 +
top-p 0.9, min-p 0.05, logprobs 5 and 20 (temperature 0.8 where random). Batches 1, 8, 32, 256,
1024; shapes 152064 fp32, 128256 bf16, 32000 bf16. Logits `randn * 3`, every row a one-row
request with the mode's settings, layout K = 20 (the largest K the modes ask for), no bitmask:
the call `benchmarks.bench_sampling` times as `sampler_gpu_us`. The report's extra_info holds,
per case, `sampler_gpu_us` (median per call from CUDA events around a graph of 10 calls), its
p90, `read_gbs` (the logits' bytes over that time) and `slow_paths` (rows the candidates did
not settle during the case's calls, `SamplerWorkspace.paths`).

Every kernel variant the module launches is compiled before the first case is timed, on one
thread per core (`benchmarks.profile_kernels.compile_ahead`): compiled one at a time at first
launch, they took most of a 10-minute device call.
"""

import pytest
import torch

from benchmarks.profile_kernels import compile_ahead
from benchmarks.sampling_modes import (BATCHES, MAX_LOGPROBS, MODES, SHAPES, make_logits,
                                       sampler_call)
from benchmarks.timing import benchmark_graph
from graphshard.config import Config

MODE_NAMES = ("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "min_p", "logprobs_5",
              "logprobs_20")
REPEAT = 10


class Logits:
    """One shape's logits [max batch, padded vocab] at a time (a 152064 fp32 block is 623 MB)."""

    def __init__(self, device):
        self.device, self.shape, self.block = device, None, None

    def rows(self, vocab: int, dtype: torch.dtype, batch: int) -> torch.Tensor:
        if self.shape != (vocab, dtype):
            self.block = None  # freed before the next shape's block is made
            padded = Config(vocab_size=vocab, max_num_reqs=1).padded_vocab_size(1)
            self.block = make_logits(max(BATCHES), padded, dtype, self.device)
            self.shape = (vocab, dtype)
        return self.block[:batch]


@pytest.fixture(scope="module")
def logits(cuda):
    """The logits source, once every variant of the module is compiled (the mode does not pick
    a variant: one greedy call per shape and batch launches them all)."""
    source = Logits(cuda)
    calls = [sampler_call(source.rows(vocab, dtype, batch), vocab, MODES["greedy"],
                          MAX_LOGPROBS, cuda)[0]
             for vocab, dtype in SHAPES for batch in BATCHES]
    compile_ahead(calls)
    return source


# The lowest decorator varies slowest: one shape's logits serve all of its cases.
@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("vocab, dtype", SHAPES, ids=lambda v: str(v).removeprefix("torch."))
def test_sampler(benchmark, logits, mode, batch, vocab, dtype):
    rows = logits.rows(vocab, dtype, batch)
    call, workspace = sampler_call(rows, vocab, MODES[mode], MAX_LOGPROBS, rows.device)
    before = workspace.paths()
    stats = benchmark_graph(benchmark, call, REPEAT, rounds=10)
    after = workspace.paths()
    read_gb = rows[:, :vocab].numel() * rows.element_size() / 1e9
    benchmark.extra_info.update(
        mode=mode, batch=batch, vocab=vocab, dtype=str(dtype).removeprefix("torch."),
        sampler_gpu_us=stats["median_us"], sampler_gpu_p90_us=stats["p90_us"],
        read_gbs=read_gb / (stats["median_us"] * 1e-6),
        slow_paths={k: after[k] - before[k] for k in after})
