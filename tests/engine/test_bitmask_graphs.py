"""A tp = 1 engine with bitmask support captures each bucket with and without it
(`bitmask_free_graphs`): a step given no bitmask replays the graph without, a step with one the
other, a step above the largest bucket runs eagerly; every step equals the oracle (the engine's
own bitmask-capable sampler, unsharded). CPU, interpreter, emulated graphs."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams

SETTINGS = [SamplingParams(temperature=0.0, num_logprobs=2),
            SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=1),
            SamplingParams(temperature=1.0, top_p=0.7, seed=2),
            SamplingParams(temperature=0.6, min_p=0.1, seed=3, num_logprobs=1)]
CFG = Config(vocab_size=300, vocab_pad_multiple=8, max_num_reqs=5, max_num_logits_per_req=2,
             max_num_slots=8, buckets=(2, 4), num_logprobs=2)


def _check_step(engine, idx, cu, lens, logits, drafts, mask, in_place):
    """One step against the oracle, its logits passed in place or as a tensor; `read()` too."""
    if in_place:
        engine.inputs.logits[:logits.shape[0]].copy_(logits)
    out = engine.step(idx, cu, lens, None if in_place else logits, drafts, grammar_bitmask=mask)
    want = sample_unsharded(logits, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                            tables=engine.tables, layout=engine.layout,
                            vocab_size=engine.config.vocab_size, draft_token_ids=drafts,
                            grammar_bitmask=mask)
    assert compare(out, want) is None, compare(out, want)
    assert np.array_equal(engine.read().records, out.to_host().records)


def _bitmask_steps(engine, cfg, gen):
    """Six steps of mixed requests of one or two rows (drafts on every row) at both buckets, a
    bitmask on every other one, step 4 passing its logits in place (`logits=None`); each step's
    records against the oracle's (the engine's own bitmask-capable sampler, unsharded)."""
    words = engine.inputs.bitmask_widths[0]
    for step in range(6):
        n = (1, 2, 4, 3, 2, 4)[step]
        idx = np.array([(step + j) % cfg.max_num_slots for j in range(n)], np.int32)
        rows = torch.randint(1, cfg.max_num_logits_per_req + 1, (n,), generator=gen).numpy()
        cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        num_logits = int(cu[-1])
        lens = np.full(n, 5 + step, np.int32)
        logits = torch.randn(num_logits, engine.vocab_shard, generator=gen) * 3
        drafts = torch.randint(0, cfg.vocab_size, (num_logits,), generator=gen, dtype=torch.int32)
        mask = None
        if step % 2:
            mask = torch.randint(-2**31, 2**31 - 1, (num_logits, words), generator=gen,
                                 dtype=torch.int32)
        _check_step(engine, idx, cu, lens, logits, drafts, mask, in_place=step == 4)


def test_steps_without_a_bitmask_replay_the_bitmask_free_graph():
    """tp = 1 with bitmask support: every bucket also has a graph without it, which the steps
    given no bitmask replay (and the others the graph with it); both equal the oracle. With
    `bitmask_free_graphs = false`, or without bitmask support, a bucket has one graph."""
    cfg = CFG.replace(max_num_reqs=4, max_num_slots=6)
    plain, masked = ("no_bitmask",), ()
    for changes, graphs in (({}, {masked, plain}), ({"bitmask_free_graphs": False}, {masked}),
                            ({"grammar_bitmask": False}, None)):
        engine = Engine(cfg.replace(**changes))
        engine.capture()
        for slot in range(cfg.max_num_slots):
            engine.add_request(slot, SETTINGS[slot % len(SETTINGS)])
        gen = torch.Generator().manual_seed(5)
        if graphs is None:  # no bitmask may come: the steps without one, the same graphs
            assert not engine.stats()["bitmask_free_graphs"]
            assert set(engine.stats()["replays"]) == {(b, "replicate", 0) for b in cfg.buckets}
            continue
        _bitmask_steps(engine, cfg, gen)
        stats = engine.stats()
        assert stats["bitmask_free_graphs"] == (plain in graphs)
        assert set(stats["replays"]) == {(b, "replicate", 0, *g) for b in cfg.buckets
                                         for g in graphs}
        # Steps 0, 2, 4 (n = 1, 4, 2) without a bitmask, steps 1, 3, 5 (n = 2, 3, 4) with one.
        if plain in graphs:
            assert stats["replays"] == {(2, "replicate", 0, "no_bitmask"): 2,
                                        (4, "replicate", 0, "no_bitmask"): 1,
                                        (2, "replicate", 0): 1, (4, "replicate", 0): 2}
        else:
            assert stats["replays"] == {(2, "replicate", 0): 3, (4, "replicate", 0): 3}


@pytest.fixture(scope="module")
def captured():
    """One captured engine for every example (capturing takes seconds in the interpreter)."""
    engine = Engine(CFG)
    engine.capture()
    yield engine
    engine.close()


@settings(deadline=None, max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_steps_replay_the_graph_their_bitmask_asks_for(captured, data):
    """Slot churn, then steps of 0 to 5 requests (5: above the largest bucket, eager) of one or
    two rows, with or without a bitmask, logits in place or not: each step replays exactly the
    graph its size and bitmask pick (or none) and equals the oracle."""
    engine = captured
    for slot in range(CFG.max_num_slots):  # churn: every slot free or refilled at random
        if engine.checker.active[slot]:
            engine.remove_request(slot)
        if data.draw(st.booleans()):
            engine.add_request(slot, data.draw(st.sampled_from(SETTINGS)))
    active = [s for s in range(CFG.max_num_slots) if engine.checker.active[s]]
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    for _ in range(data.draw(st.integers(1, 3))):
        n = data.draw(st.integers(0, min(len(active), CFG.max_num_reqs)))
        idx = np.array(data.draw(st.permutations(active))[:n], np.int32)
        rows = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
        cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        num_logits = int(cu[-1])
        lens = np.array(data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n)),
                        np.int32)
        logits = torch.randn(num_logits, engine.vocab_shard, generator=gen) * 3
        drafts = torch.randint(0, CFG.vocab_size, (num_logits,), generator=gen, dtype=torch.int32)
        mask = None
        if data.draw(st.booleans()):
            mask = torch.randint(-2**31, 2**31 - 1, (num_logits, engine.inputs.bitmask_widths[0]),
                                 generator=gen, dtype=torch.int32)
        before = engine.stats()
        _check_step(engine, idx, cu, lens, logits, drafts, mask, in_place=data.draw(st.booleans()))
        after = engine.stats()
        bucket = engine.graphs.bucket_for(n)
        want = {} if bucket is None else \
            {(bucket, "replicate", 0, *(() if mask is not None else ("no_bitmask",))): 1}
        ran = {key: count - before["replays"][key] for key, count in after["replays"].items()
               if count != before["replays"][key]}
        assert ran == want, (n, mask is not None, ran)
        assert after["eager_fallbacks"] - before["eager_fallbacks"] == (bucket is None)
