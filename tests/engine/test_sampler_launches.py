"""What `capture()` compiles ahead is what the steps launch: the sampler calls that
`StepParts.sampler_launches` records for the capture's keys and the eager keys are, argument for
argument (tensors by address, shape, strides and dtype), a superset of the sampler launches of
the capture's warm-up and capture runs and of later steps above the largest bucket, and hold
every capture launch. CPU, interpreter, emulated graphs (there the compile itself is skipped:
nothing compiles)."""

import numpy as np
import pytest
import torch

import graphshard.runtime.launch as runtime_launch
import graphshard.sample.kernels as kernels
from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.engine.capture import fallback_keys, graph_keys
from graphshard.engine.routes import eager_keys, unmasked
from graphshard.harness.distributed import spawn
from graphshard.sample.params import SamplingParams

CFG = Config(vocab_size=300, vocab_pad_multiple=8, max_num_reqs=12, max_num_logits_per_req=3,
             max_num_slots=30, buckets=(1, 4, 8), graph_backend="emulated", num_logprobs=2)


def _describe(value):
    if hasattr(value, "data_ptr"):
        return ("tensor", value.data_ptr(), tuple(value.shape), value.stride(), str(value.dtype))
    if isinstance(value, tuple):
        return (type(value).__name__, *map(_describe, value))
    if isinstance(value, dict):
        return tuple(sorted((k, _describe(v)) for k, v in value.items()))
    return (type(value).__name__, repr(value))


def _key(kernel, grid, args, kwargs):
    return (kernel.fn.__name__, tuple(grid), _describe(args), _describe(kwargs))


def _launches(rank, world, cfg):
    """(what capture compiled ahead, what the capture launched, what steps above the largest
    bucket launched), as sets of described launches."""
    engine = Engine(cfg)
    ahead, ran = set(), set()
    compiled_keys = []

    def record_ahead(keys):
        compiled_keys.extend(keys)
        ahead.update(_key(*item) for item in engine.parts.sampler_launches(keys))
        ran.clear()  # the recording went through `record_run` too

    real_launch = kernels.launch

    def record_run(kernel, grid, *args, **kwargs):
        if kernel.fn.__module__.startswith("graphshard.sample."):  # the sampler's, not the step's
            ran.add(_key(kernel, grid, args, kwargs))
        return real_launch(kernel, grid, *args, **kwargs)

    engine._compile_samplers = record_ahead
    # A step's sampler call replays its recorded launches through runtime.launch (`recorded`).
    kernels.launch = runtime_launch.launch = record_run
    try:
        engine.capture()
        captured, ran = ran, set()
        for slot in range(cfg.max_num_reqs):
            engine.add_request(slot, SamplingParams(temperature=0.7, top_k=5, seed=slot))
        rng = np.random.default_rng(0)
        for n in range(cfg.max_bucket + 1, cfg.max_num_reqs + 1):
            idx = rng.permutation(cfg.max_num_reqs)[:n].astype(np.int32)
            rows = rng.integers(1, cfg.max_num_logits_per_req + 1, n)
            cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
            logits = torch.randn(int(cu[-1]), engine.vocab_shard,
                                 generator=torch.Generator().manual_seed(n))
            engine.step(idx, cu, np.full(n, 3, np.int32), logits)
    finally:
        kernels.launch = runtime_launch.launch = real_launch
    return ahead, captured, ran, engine.stats(), len(compiled_keys)


# "auto" records both strategies' keys; its eager steps take the one timing chose for the
# largest bucket, so "shard" pins the shard eager keys.
@pytest.mark.parametrize("tp, strategy, grammar", [(1, "replicate", True), (2, "auto", True),
                                                   (2, "shard", True), (2, "shard", False)])
def test_compiled_ahead_holds_what_captures_and_eager_steps_launch(tp, strategy, grammar):
    cfg = CFG.replace(strategy=strategy, grammar_bitmask=grammar)
    if tp == 1:
        results = [_launches(0, 1, cfg)]
    else:
        results = spawn(_launches, tp, cfg, timeout_s=900)
    for ahead, captured, eager, stats, keys in results:
        assert captured <= ahead and eager <= ahead
        assert eager - captured  # steps above the largest bucket launch variants of their own
        assert {name for name, *_ in captured} == {"_scan_kernel", "_finish_kernel"}
        masks = {_bitmask_args(launch) for launch in ahead | eager}
        if grammar:
            # Both scan variants (bitmask support and none) and one finish per graph.
            assert len(captured) >= 3 * len(CFG.buckets)
            assert masks != {_NO_BITMASK}
            # At tp = 1 every bucket's graph without bitmask support (`bitmask_free_graphs`)
            # launches a finish without it, which the masked graphs never do.
            plain = {launch[0] for launch in captured if _bitmask_args(launch) == _NO_BITMASK}
            assert ("_finish_kernel" in plain) == (tp == 1)
            assert stats["bitmask_free_graphs"] == (tp == 1)
        else:
            # One scan and one finish per graph, none with a bitmask or its flag.
            assert len(captured) == 2 * len(CFG.buckets)
            assert masks == {_NO_BITMASK}
        assert stats["eager_fallbacks"] == CFG.max_num_reqs - CFG.max_bucket


# Both kernels' positional (mask, bitmask_stride, bitmask_enabled) without bitmask support.
_NO_BITMASK = tuple(_describe(v) for v in (None, 0, None))


def _bitmask_args(launch):
    """(mask, bitmask_stride, bitmask_enabled) of a described launch: its positional arguments
    (logits, num_reqs, req_slots, cu_num_logits, seq_lens, mask, stride, flag, ...)."""
    return launch[2][1:][5:8]


def test_eager_keys_cover_every_size_and_capacity_above_the_largest_bucket():
    assert eager_keys(8, 8, ("shard", "replicate"), 2) == []  # no step above the largest bucket
    assert eager_keys(8, 12, ("replicate",), 2) == [(n, "replicate", 0) for n in range(9, 13)]
    # Nine rows or more over two owners: the busiest takes at least 5.
    assert eager_keys(8, 12, ("shard",), 2) == [(12, "shard", c) for c in range(5, 13)]
    # With fallback "error" no step runs above the largest bucket.
    shard = {b: "shard" for b in CFG.buckets}
    assert fallback_keys(CFG.replace(fallback="error"), shard, 2, auto=True) == []
    assert fallback_keys(CFG, shard, 2, auto=False) == eager_keys(8, 12, ("shard",), 2)
    # "auto" chooses the largest bucket's strategy after the compile: both are compiled.
    assert fallback_keys(CFG, shard, 2, auto=True) == eager_keys(8, 12, ("shard", "replicate"), 2)


def test_graph_keys_cover_every_bucket_tier_and_strategy():
    tiers = {1: (1,), 4: (2, 4), 8: (4, 8)}
    shard = {b: "shard" for b in CFG.buckets}
    assert graph_keys(CFG, shard, tiers, auto=False, bitmask_free=False) == [
        (1, "shard", 1), (4, "shard", 2), (4, "shard", 4), (8, "shard", 4), (8, "shard", 8)]
    both = graph_keys(CFG, shard, tiers, auto=True, bitmask_free=False)
    assert both[:3] == [(1, "shard", 1), (1, "replicate", 0), (4, "shard", 2)]
    assert len(both) == 8 and len(set(both)) == 8
    replicate = {b: "replicate" for b in CFG.buckets}
    keys = graph_keys(CFG, replicate, {}, auto=False, bitmask_free=True)
    plain = [(b, "replicate", 0) for b in (1, 4, 8)]
    assert keys == plain + [unmasked(k) for k in plain]
