"""The decode-loop sweep end to end on 2 GPUs, at a small size (the full sweep: run_gpu.sh)."""

import pytest
import torch

from graphshard.harness.cli import bench_settings, build_parser
from graphshard.config import Config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="needs 2 CUDA GPUs")


def test_the_sweep_runs_every_path_and_agrees_with_the_argmax(tmp_path):
    from graphshard.harness.bench import run

    preset = "configs/qwen2-152k.toml"
    args = build_parser().parse_args(["bench", "--config", preset, "--batches", "1,8", "--dtypes", "bfloat16",
                                      "--iters", "20", "--warmup", "5", "--aligned-iters", "5"])
    rows = run(bench_settings(Config.from_toml(preset), args), tmp_path, tp=2)
    assert {r["path"] for r in rows} >= {"bare_allgather_graph", "graphshard_nccl", "graphshard_replicate",
                                         "graphshard_auto", "graphshard_tp1", "captured_argmax"}
    assert all(r["same_tokens"] for r in rows), [r for r in rows if not r["same_tokens"]]
    assert (tmp_path / "loop.json").exists() and (tmp_path / "auto.json").exists()
