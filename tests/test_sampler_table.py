"""`benchmarks.sampler_table` turns the sampler benchmark's pytest-benchmark JSON into a table
per shape, with each mode over greedy at the same batch; the module's cases cover every mode x
batch x shape of the sampling targets (collected here; timed only on a GPU)."""

import json
import subprocess
import sys

from benchmarks import sampler_table


def _case(mode, batch, vocab, dtype, us):
    return {"name": f"test_sampler[{vocab}-{dtype}-{batch}-{mode}]",
            "extra_info": dict(mode=mode, batch=batch, vocab=vocab, dtype=dtype, sampler_gpu_us=us)}


def test_tables_give_each_mode_over_greedy_at_its_batch(tmp_path):
    report = {"benchmarks": [
        _case("greedy", 1, 32000, "bfloat16", 4.0), _case("top_p", 1, 32000, "bfloat16", 10.0),
        _case("greedy", 256, 32000, "bfloat16", 12.0), _case("top_p", 256, 32000, "bfloat16", 18.0),
        _case("greedy", 1, 152064, "float32", 5.0), _case("logprobs_5", 1, 152064, "float32", 7.5),
        {"name": "test_plan[1]", "extra_info": {"bucket": 1}}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(report))
    sampler_table.main([str(path), "--out", str(tmp_path / "t.md")])
    text = (tmp_path / "t.md").read_text()
    first, second = text.split("V = ")[1:]
    assert first.startswith("152064 float32") and second.startswith("32000 bfloat16")
    assert "| logprobs_5 | 7.5 (1.50×) |" in first
    assert "| top_p | 10.0 (2.50×) | 18.0 (1.50×) |" in second
    assert "| greedy | 4.0 | 12.0 |" in second


def test_the_benchmark_covers_every_mode_batch_and_shape():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "benchmarks/test_bench_sampler.py"], capture_output=True, text=True,
                         check=True).stdout
    ids = {line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "test_sampler[" in line}
    modes = ("greedy", "temperature", "top_k", "top_p", "top_k_top_p", "min_p", "logprobs_5",
             "logprobs_20")
    shapes = ("152064-float32", "128256-bfloat16", "32000-bfloat16")
    assert ids == {f"{s}-{b}-{m}" for s in shapes for b in (1, 8, 32, 256, 1024) for m in modes}
