"""Exchange alone on 2 GPUs (p2p, padded NCCL, eager uneven all-to-all), device times in extra_info."""

import pytest
import torch

from benchmarks.bench_exchange import bench_rank
from graphshard.harness.distributed import spawn


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_exchange(benchmark, dtype):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    results = benchmark.pedantic(lambda: spawn(bench_rank, 2, 152064, dtype, backend="nccl", timeout_s=600),
                                 rounds=1, iterations=1)
    worst = []
    for i, row in enumerate(results[0]):
        worst.append({k: (max(r[i][k] for r in results) if k not in ("rows", "bytes_crossing") else v)
                      for k, v in row.items()})
    benchmark.extra_info.update(vocab=152064, dtype=dtype, exchange_gpu_us=worst)
