"""`benchmarks.mixed_steps` on a small config (interpreter, emulated graphs): graph and eager
steps are timed, their host parts recorded and every step checked against the oracle; the
summary groups them."""

import gzip
import json

import pytest

from benchmarks import mixed_steps

SMALL = mixed_steps.MIXED.replace(vocab_size=300, max_num_reqs=6, max_num_slots=12,
                                  buckets=(1, 2, 4), graph_backend="emulated")


def test_steps_are_timed_split_into_parts_and_verified():
    result = mixed_steps.run(12, seed=3, parts=True, verify=True, cfg=SMALL, launch_rounds=2)
    steps = result["steps"]
    assert result["verified"] == 12 and len(steps) == 12
    assert {s["eager"] for s in steps} == {True, False}  # the workload crosses the largest bucket
    for s in steps:
        assert 0 < s["issue_us"] <= s["step_us"]
        run = "engine._run_eager" if s["eager"] else "engine._run"
        assert s["parts"][run] > 0 and s["parts"]["engine._check_step"] > 0
        assert set(s["paths"]) <= set(mixed_steps.STAT_PATHS)
    # Both ways of launching an eager step's sampler call are timed, launch by launch.
    assert result["launch_us"] and all(p > 0 and b > 0 for p, b in result["launch_us"].values())
    assert any("_scan_kernel" in name for name in result["launch_us"])
    text = mixed_steps.summary(result)
    assert "host µs per launch of an eager step's sampler call" in text
    assert "12 steps equal to the oracle" in text
    assert "host µs per step of each part of step()" in text
    graph = next(line for line in text.splitlines() if line.startswith("graph "))
    timed = steps[mixed_steps.warm_up(steps):]
    assert int(graph.split()[1]) == sum(not s["eager"] for s in timed)


def _run(step_us, fetch_us, n=(3, 5, 2, 4, 6, 1, 2, 3, 5, 4, 6, 2)):
    return {"steps": [{"n": k, "rows": k, "eager": k > 4, "step_us": s, "issue_us": s / 2,
                       "parts": {"inputs.fetch": f} if k > 4 else {}}
                      for k, s, f in zip(n, step_us, fetch_us)]}


def test_paired_differences_are_taken_step_by_step_after_the_warm_up(tmp_path):
    base = _run([100.0 + 10 * i for i in range(12)], [50.0] * 12)
    # Every step 4 µs slower but the first (a warm-up step), fetches 20 µs faster.
    other = _run([100.0 + 10 * i + (500 if i == 0 else 4) for i in range(12)], [30.0] * 12)
    result = mixed_steps.paired(base, other)
    timed = 12 - mixed_steps.warm_up(base["steps"])
    assert result["step"] == (timed, 4.0) and result["issue"] == (timed, 2.0)
    eager = sum(s["n"] > 4 for s in base["steps"][mixed_steps.warm_up(base["steps"]):])
    assert result["inputs.fetch"] == (eager, -20.0)
    path = tmp_path / "other.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(other, f)
    assert mixed_steps.load(str(path)) == other


def test_runs_of_other_batches_are_not_paired():
    base = _run([100.0] * 12, [50.0] * 12)
    other = _run([100.0] * 12, [50.0] * 12, n=(4, 5, 2, 4, 6, 1, 2, 3, 5, 4, 6, 2))
    with pytest.raises(ValueError, match="same batches"):
        mixed_steps.paired(base, other)
