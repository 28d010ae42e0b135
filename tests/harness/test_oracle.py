"""The oracle launches the sampler exactly as the engine does, so a checked run compiles the
sampler once on a GPU (each specialization of the per-request kernel takes over a minute)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graphshard.harness.demo as demo
import graphshard.sample.kernels as sampler
from graphshard.config import Config
from graphshard.harness.demo import DemoSettings, run_rank
from graphshard.harness.oracle import sample_unsharded
from graphshard.runtime.launch import specialization_key
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout


@pytest.mark.parametrize("grammar", [True, False])
def test_oracle_shares_the_engines_sampler_specialization(monkeypatch, grammar):
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
    cfg = Config.from_toml("configs/cpu-demo.toml").replace(grammar_bitmask=grammar)
    result = run_rank(0, 1, cfg, DemoSettings(steps=12, seed=0))
    assert result["verified"] == 12
    # The run's steps come with and without a bitmask (without support, never with one).
    assert {bitmask for _, bitmask in inputs} == ({False, True} if grammar else {False})
    assert {name for name, _ in keys["oracle"]} == {"_scan_kernel", "_finish_kernel"}
    assert keys["oracle"] <= keys["engine"]


def test_a_step_without_a_bitmask_samples_alike_with_and_without_bitmask_support():
    """Bitmask support changes which kernels run, not what a step without a bitmask samples:
    the flag sends it through the same lean scan."""
    vocab, rows = 700, 12
    layout = RecordLayout(max_num_logits_per_req=2, num_logprobs=3)
    tables = SlotTables(8, "cpu")
    kinds = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.1, top_k=7),
             dict(temperature=0.7, top_p=0.6), dict(temperature=1.0, min_p=0.05),
             dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.01)]
    for slot in range(8):
        tables.set(slot, SamplingParams(**kinds[slot % len(kinds)], seed=slot, num_logprobs=slot % 4))
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, 704, generator=g) * 3
    logits[3, :50] = float("nan")
    batch = dict(idx_mapping=np.array([5, 0, 3, 7, 1, 2, 6, 4], np.int32),
                 cu_num_logits=np.array([0, 2, 3, 5, 6, 8, 9, 11, 12], np.int32),
                 seq_lens=np.arange(8, dtype=np.int32) * 97, tables=tables, layout=layout,
                 vocab_size=vocab, draft_token_ids=logits[:, :vocab].argmax(1).int())
    on = sample_unsharded(logits, **batch)
    off = sample_unsharded(logits, **batch, bitmask_support=False)
    assert torch.equal(off.records, on.records)  # bit for bit, logprobs included
    assert on.topk_ids is not None and (on.num_sampled > 1).any()
    with pytest.raises(ValueError, match="bitmask_support=False"):
        sample_unsharded(logits, **batch, bitmask_support=False,
                         grammar_bitmask=torch.zeros(rows, 22, dtype=torch.int32))
