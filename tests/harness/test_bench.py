"""The sweep's CPU parts: its command line, the merge of the ranks and the files it writes.
The timed loops themselves need GPUs (tests/gpu/test_bench_gpu.py, benchmarks/run_gpu.sh)."""

import json

import pytest

from graphshard.harness.bench_report import PATHS, ROW_KEYS, summarize, write_results
from graphshard.harness.cli import bench_settings, build_parser
from graphshard.config import Config

PRESET = "configs/qwen2-152k.toml"


def _settings(*argv):
    args = build_parser().parse_args(["bench", "--config", PRESET, *argv])
    return bench_settings(Config.from_toml(PRESET), args)


def test_the_command_line_picks_subsets():
    s = _settings("--batches", "1,32", "--dtypes", "bfloat16", "--paths",
                  "graphshard_p2p,captured_argmax", "--iters", "50", "--aligned-iters", "0")
    assert s.batches == (1, 32) and s.dtypes == ("bfloat16",) and s.vocabs == (152064,)
    assert s.paths == ("graphshard_p2p", "captured_argmax") and s.iters == 50 and s.aligned_iters == 0
    default = _settings()
    assert default.batches == (1, 8, 32, 128, 256, 1024) and default.dtypes == ("float32", "bfloat16")
    assert set(default.paths) == set(PATHS) and default.base.vocab_size == 152064


def test_the_sweep_imports_without_a_gpu():
    from graphshard.harness import baselines, bench

    assert set(bench.ENGINE_PATHS) < set(PATHS) and callable(baselines.BareAllGatherGraph)


def test_an_unknown_path_is_refused():
    with pytest.raises(SystemExit, match="unknown path"):
        _settings("--paths", "graphshard_p2p,fastest")


def _row(path, batch, rank, step, same=True, tp=2):
    return dict(path=path, batch=batch, vocab=152064, dtype="float32", tp=tp, rank=rank, agreement=False,
                step_us=step, step_p90_us=step * 1.2, issue_us=step / 10, aligned_step_us=step * 2,
                same_tokens=same)


def test_the_slowest_rank_counts_and_tokens_must_match_everywhere(tmp_path):
    per_rank = [[_row("graphshard_p2p", 1, 0, 100), _row("bare_allgather_graph", 1, 0, 40),
                 _row("graphshard_tp1", 1, 0, 30, tp=1)],
                [_row("graphshard_p2p", 1, 1, 120, same=False), _row("bare_allgather_graph", 1, 1, 35),
                 _row("graphshard_tp1", 1, 1, 31, tp=1)]]
    rows = summarize(per_rank)
    assert [r["path"] for r in rows] == ["bare_allgather_graph", "graphshard_p2p", "graphshard_tp1"]
    p2p = rows[1]
    assert p2p["step_us"] == 120 and p2p["issue_us"] == 12 and p2p["same_tokens"] is False
    assert rows[0]["step_us"] == 40 and "rank" not in rows[0]
    auto = [{"vocab": 152064, "dtype": "float32", "strategy": {1: "shard"},
             "timings_us": {1: {"shard": 20.0, "replicate": 30.0}}, "capture_s": 3.0}]
    text = write_results(tmp_path, rows, auto, {"iters": 200})
    loop = json.loads((tmp_path / "loop.json").read_text())
    assert all(set(ROW_KEYS) <= set(r) for r in loop) and loop[1]["step_us"] == 120
    assert "| 1 | 40 (4) | 120 (12) ✗ |" in text and "| 1 | shard | 20 | 30 |" in text
    assert json.loads((tmp_path / "auto.json").read_text())["auto"][0]["strategy"] == {"1": "shard"}
    assert (tmp_path / "loop.md").read_text().startswith("V = 152064, float32, tp = 2")
