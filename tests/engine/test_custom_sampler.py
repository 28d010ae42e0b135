"""A user's own sampler plugged into the engine, and the graph-safety checks it must pass."""

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.sample.params import SamplingParams
from graphshard.harness.testing import GraphSafetyError

CFG = Config(vocab_size=200, vocab_pad_multiple=8, max_num_reqs=8, max_num_slots=16,
             buckets=(2, 4, 8), graph_backend="emulated")


def torch_greedy(logits, *, vocab_size, num_reqs, req_slots, cu_num_logits, seq_lens, tables, layout,
                 records, max_num_reqs, draft_tokens=None, bitmask=None, bitmask_rows=None,
                 bitmask_enabled=None):
    """Greedy over each request's first row with plain torch ops, masked by the device count."""
    m = layout.max_num_logits_per_req
    live = torch.arange(max_num_reqs, device=logits.device) < num_reqs
    first = cu_num_logits[:max_num_reqs].long().clamp(max=logits.shape[0] - 1)
    rows = logits.index_select(0, first)[:, :vocab_size].float()
    tokens = rows.argmax(dim=1).to(torch.int32)
    counts = (cu_num_logits[1:max_num_reqs + 1] - cu_num_logits[:max_num_reqs]).clamp(min=1)
    block = records[:max_num_reqs]
    block[:, 0] = torch.where(live, tokens, block[:, 0])
    block[:, layout.num_sampled] = torch.where(live, torch.ones_like(tokens), block[:, layout.num_sampled])
    block[:, layout.num_rejected] = torch.where(live, counts - 1, block[:, layout.num_rejected])
    block[:, layout.num_nans] = torch.where(live, torch.zeros_like(tokens), block[:, layout.num_nans])
    if m > 1:
        block[:, 1:m] = torch.where(live[:, None], -1, block[:, 1:m])


def unsafe_greedy(logits, *, num_reqs, **kwargs):
    if int(num_reqs.item()) < 0:  # a host sync: a CUDA graph would freeze this branch
        raise AssertionError
    torch_greedy(logits, num_reqs=num_reqs, **kwargs)


def test_user_sampler_runs_in_the_captured_step():
    engine = Engine(CFG, sampler=torch_greedy)
    engine.capture()
    for slot in range(CFG.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 4, 7, 8, 5):
        idx = rng.choice(CFG.max_num_slots, n, replace=False).astype(np.int32)
        logits = torch.randn(n, engine.vocab_shard)
        out = engine.step(idx, np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32), logits)
        assert out.sampled_token_ids[:, 0].tolist() == logits[:, : CFG.vocab_size].argmax(1).tolist()
    assert sum(engine.stats()["replays"].values()) == 7


def test_unsafe_user_sampler_is_refused_at_capture():
    engine = Engine(CFG, sampler=unsafe_greedy)
    with pytest.raises(GraphSafetyError, match="item"):
        engine.capture()
