"""The full step per bucket on one GPU (tp = 1): graph replay vs the same step run eagerly."""

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.sample.params import SamplingParams

BUCKETS = (1, 8, 32, 128, 256, 512, 1024)


@pytest.fixture(scope="module")
def engines():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present")
    cfg = Config(vocab_size=152064, max_num_reqs=max(BUCKETS), max_num_slots=2 * max(BUCKETS),
                 buckets=BUCKETS, graph_backend="cuda")
    graph, eager = Engine(cfg), Engine(cfg)
    for e in (graph, eager):
        for slot in range(cfg.max_num_slots):
            e.add_request(slot, SamplingParams(temperature=0.0))
    graph.capture()
    return graph, eager


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("batch", BUCKETS)
def test_step(benchmark, engines, batch, mode):
    engine = engines[0] if mode == "graph" else engines[1]
    idx, cu = np.arange(batch, dtype=np.int32), np.arange(batch + 1, dtype=np.int32)
    lens = np.full(batch, 100, dtype=np.int32)
    logits = engine.inputs.logits[:batch]
    logits.normal_()

    def timed():
        return engine.step(idx, cu, lens, logits).records.cpu()

    for _ in range(3):
        timed()
    out = benchmark.pedantic(timed, rounds=30, warmup_rounds=3)
    want = logits.float()[:, :152064].argmax(dim=1).cpu()
    assert torch.equal(out[:, 0].long(), want)
    benchmark.extra_info.update(batch=batch, mode=mode, tp=1, step_includes="host issue + replay + host read")
