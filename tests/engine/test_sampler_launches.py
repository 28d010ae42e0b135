"""What `capture()` compiles ahead is what its graphs launch: the sampler calls that
`Engine._sampler_launches` records for the capture's keys are, argument for argument (tensors
by address, shape, strides and dtype), the sampler launches the warm-up and capture runs make.
CPU, interpreter, emulated graphs (there the compile itself is skipped: nothing compiles)."""

import pytest

import graphshard.sample.kernels as kernels
from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.distributed import spawn

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
    """(what capture compiled ahead, what its runs launched), as sets of described launches."""
    engine = Engine(cfg)
    ahead, ran = set(), set()

    def record_ahead(keys):
        ahead.update(_key(*item) for item in engine._sampler_launches(keys))

    real_launch = kernels.launch

    def record_run(kernel, grid, *args, **kwargs):
        ran.add(_key(kernel, grid, args, kwargs))
        return real_launch(kernel, grid, *args, **kwargs)

    engine._compile_samplers = record_ahead
    kernels.launch = record_run
    try:
        engine.capture()
    finally:
        kernels.launch = real_launch
    return ahead, ran, engine.stats()["strategy"]


@pytest.mark.parametrize("tp, strategy", [(1, "replicate"), (2, "auto")])
def test_compiled_ahead_is_what_the_graphs_launch(tp, strategy):
    cfg = CFG.replace(strategy=strategy)
    if tp == 1:
        results = [_launches(0, 1, cfg)]
    else:
        results = spawn(_launches, tp, cfg, timeout_s=900)
    for ahead, ran, _ in results:
        assert ahead == ran
        assert {name for name, *_ in ran} == {"_scan_kernel", "_finish_kernel"}
        # Both scan variants (bitmask support and none) and one finish per graph.
        assert len(ran) >= 3 * len(CFG.buckets)
