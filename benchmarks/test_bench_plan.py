"""Plan kernel GPU time per call inside a graph, per bucket (target: <= 6 us at bucket 1024)."""

import numpy as np
import pytest
import torch

from benchmarks.timing import benchmark_graph
from graphshard.plan.kernel import plan
from graphshard.plan.layout import PlanBuffers

BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
MAX_REQS, MAX_M, TP = 1024, 1, 2
REPEAT = 50


@pytest.mark.parametrize("bucket", BUCKETS)
def test_plan_kernel(benchmark, cuda, bucket):
    rng = np.random.default_rng(bucket)
    idx = torch.zeros(MAX_REQS, dtype=torch.int32)
    idx[:bucket] = torch.from_numpy(rng.choice(2 * MAX_REQS, bucket, replace=False).astype(np.int32))
    inputs = dict(idx_mapping=idx.to(cuda),
                  cu_num_logits=torch.arange(MAX_REQS + 1, dtype=torch.int32, device=cuda),
                  seq_lens=torch.full((MAX_REQS,), 100, dtype=torch.int32, device=cuda),
                  num_reqs=torch.tensor([bucket], dtype=torch.int32, device=cuda))
    buf = PlanBuffers.allocate(MAX_REQS, MAX_M, TP, cuda)

    def step():
        plan(buf, **inputs, tp_rank=0, gather_stride=bucket, max_num_logits_per_req=MAX_M)

    stats = benchmark_graph(benchmark, step, REPEAT, rounds=20)
    benchmark.extra_info.update(bucket=bucket, plan_gpu_us=stats["median_us"],
                                plan_gpu_p90_us=stats["p90_us"])
