"""The oracle launches the sampler exactly as the engine does, so a checked run compiles the
sampler once on a GPU (each specialization of the per-request kernel takes over a minute)."""

from __future__ import annotations

import pytest

import graphshard.harness.demo as demo
import graphshard.sample.kernels as sampler
from graphshard.config import Config
from graphshard.harness.demo import DemoSettings, run_rank
from graphshard.runtime.launch import specialization_key


def test_oracle_shares_the_engines_sampler_specialization(monkeypatch):
    keys = {"engine": set(), "oracle": set()}
    caller = ["engine"]
    inputs = set()

    def record_launch(kernel, grid, *args, **kwargs):
        keys[caller[0]].add((kernel.fn.__name__, specialization_key(kernel, args, kwargs)))
        return launch(kernel, grid, *args, **kwargs)

    def record_oracle(*args, **kwargs):
        inputs.add((kwargs.get("draft_token_ids") is not None,
                    kwargs.get("grammar_bitmask") is not None))
        caller[0] = "oracle"
        try:
            return oracle(*args, **kwargs)
        finally:
            caller[0] = "engine"

    launch, oracle = sampler.launch, demo.sample_unsharded
    monkeypatch.setattr(sampler, "launch", record_launch)
    monkeypatch.setattr(demo, "sample_unsharded", record_oracle)
    cfg = Config.from_toml("configs/cpu-demo.toml")
    result = run_rank(0, 1, cfg, DemoSettings(steps=12, seed=0))
    assert result["verified"] == 12
    # The run's steps come with and without a bitmask.
    assert {bitmask for _, bitmask in inputs} == {False, True}
    assert {name for name, _ in keys["oracle"]} == {"_scan_kernel", "_finish_kernel"}
    assert keys["oracle"] <= keys["engine"]
