"""Sampler GPU time per call inside a graph, per batch size (greedy, one row per request)."""

import pytest
import torch

from benchmarks.timing import benchmark_graph
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout
from graphshard.sample.kernels import SamplerWorkspace, sample

BATCHES = [1, 8, 32, 128, 256, 512, 1024]
REPEAT = 10


@pytest.mark.parametrize("vocab, dtype", [(152064, torch.float32), (152064, torch.bfloat16)])
@pytest.mark.parametrize("batch", BATCHES)
def test_sampler(benchmark, cuda, batch, vocab, dtype):
    logits = (torch.randn(batch, vocab, device=cuda) * 2).to(dtype)
    tables = SlotTables(batch, cuda)
    for slot in range(batch):
        tables.set(slot, SamplingParams(temperature=0.0))
    layout = RecordLayout(1, 0)
    records = torch.zeros(batch, layout.width, dtype=torch.int32, device=cuda)
    idx = torch.arange(batch, dtype=torch.int32, device=cuda)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=cuda)
    n = torch.tensor([batch], dtype=torch.int32, device=cuda)
    workspace = SamplerWorkspace.allocate(batch, 1, vocab, cuda)

    def step():
        sample(logits, vocab_size=vocab, num_reqs=n, req_slots=idx, cu_num_logits=cu, seq_lens=idx,
               tables=tables, layout=layout, records=records, max_num_reqs=batch, workspace=workspace)

    stats = benchmark_graph(benchmark, step, REPEAT, rounds=10)
    read_gb = batch * vocab * logits.element_size() / 1e9
    benchmark.extra_info.update(batch=batch, vocab=vocab, dtype=str(dtype), sampler_gpu_us=stats["median_us"],
                                sampler_gpu_p90_us=stats["p90_us"],
                                read_gbs=read_gb / (stats["median_us"] * 1e-6))
