"""The engine end to end on CPU: gloo processes, emulated graphs, every step against the oracle."""

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.demo import DemoSettings, run_rank
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.errors import BatchTooLargeError
from graphshard.engine.validate import InvalidBatchError
from graphshard.harness.workload import Workload

SMALL = Config(vocab_size=300, vocab_pad_multiple=8, max_num_reqs=12, max_num_logits_per_req=3,
               max_num_slots=30, buckets=(1, 2, 4, 8), transport="auto", graph_backend="auto",
               num_logprobs=2)


def _decode_loop(rank, world, cfg, steps, seed):
    return run_rank(rank, world, cfg, DemoSettings(steps=steps, seed=seed))


# Seeds whose (deterministic) workload visits every bucket and goes above the largest one, in
# few steps: each filtered or logprob row costs seconds under the interpreter (about 300 rows
# each here).
@pytest.mark.parametrize("tp, steps, strategy, seed", [(2, 40, "shard", 4), (3, 40, "shard", 31),
                                                       (2, 40, "replicate", 4)])
def test_sharded_steps_equal_the_oracle(tp, steps, strategy, seed):
    """Slot churn, mixed parameters, drafts, grammar rows, batches across and above the buckets."""
    cfg = SMALL.replace(strategy=strategy)
    results = spawn(_decode_loop, tp, cfg, steps, seed, timeout_s=900)
    r0 = results[0]
    assert all(r["steps"] == steps for r in results)
    assert sum(r["verified"] for r in results) == steps  # one oracle check per step
    assert r0["max_batch"] > cfg.max_bucket and r0["eager_fallbacks"] > 0
    used = {key[0] for key, count in r0["replays"].items() if count}
    assert used == set(cfg.buckets)  # every bucket replayed


@pytest.mark.parametrize("tp, transport", [(4, "gloo"), (8, "gloo"), (4, "p2p")])
def test_wide_groups_equal_the_oracle(tp, transport):
    """tp 4 and 8: more owners than requests in small batches (empty shards on most ranks)."""
    cfg = SMALL.replace(transport=transport, buckets=(2, 8), max_num_reqs=10)
    results = spawn(_decode_loop, tp, cfg, 12, 3, timeout_s=900)
    assert all(r["steps"] == 12 and r["transport"] == transport for r in results)
    assert sum(r["verified"] for r in results) == 12


def test_an_engine_without_bitmask_support_equals_the_oracle():
    """`grammar_bitmask = false`: the workload constrains no request, the steps launch the
    sampler without bitmask support, the oracle too."""
    cfg = SMALL.replace(grammar_bitmask=False, buckets=(2, 8), max_num_reqs=10)
    results = spawn(_decode_loop, 2, cfg, 12, 3, timeout_s=900)
    assert all(r["steps"] == 12 for r in results)
    assert sum(r["verified"] for r in results) == 12
    with pytest.raises(ValueError, match="grammar_bitmask = true"):
        Workload(cfg, grammar=True)


def _auto_strategy(rank, world, cfg):
    engine = Engine(cfg)
    engine.capture()
    return engine.stats()


def test_auto_strategy_agrees_across_ranks_and_reports_its_timings():
    cfg = SMALL.replace(strategy="auto", buckets=(1, 4), max_num_logits_per_req=1, num_logprobs=0)
    r0, r1 = spawn(_auto_strategy, 2, cfg, timeout_s=300)
    s0, t0 = r0["strategy"], r0["strategy_timings_us"]
    assert s0 == r1["strategy"] and set(s0) == {1, 4} and set(s0.values()) <= {"shard", "replicate"}
    assert t0 == r1["strategy_timings_us"] and set(t0) == {1, 4}  # one MAX-reduced set of numbers
    for bucket, chosen in s0.items():
        assert t0[bucket][chosen] == min(t0[bucket].values()) > 0
    # The whole capture counts, timing runs included.
    assert r0["capture_s"] > r0["graph_capture_s"] > 0


def _bad_inputs_then_good(rank, world, cfg):
    """Every rank raises the same error for each bad batch, before any collective; then a good
    step still runs (nothing hung, nothing changed)."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(6):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    shard = torch.randn(3, engine.vocab_shard)
    errors = []
    bad = [
        (np.array([0, 1, 2]), np.array([0, 2, 1, 3]), np.zeros(3, np.int32)),  # unsorted cu_num_logits
        (np.array([0, 1, 2]), np.array([0, 1, 2, 7]), np.zeros(3, np.int32)),  # too many rows for a request
        (np.array([0, 0, 2]), np.array([0, 1, 2, 3]), np.zeros(3, np.int32)),  # duplicate slot
        (np.array([0, 1, 99]), np.array([0, 1, 2, 3]), np.zeros(3, np.int32)),  # slot out of range
        (np.array([0, 1, 7]), np.array([0, 1, 2, 3]), np.zeros(3, np.int32)),  # slot without a request
    ]
    for idx, cu, lens in bad:
        try:
            engine.step(idx, cu, lens, shard)
        except InvalidBatchError as e:
            errors.append(str(e))
    for logits in (shard.double(), shard[:2], torch.randn(3, engine.vocab_shard + 1)):
        try:
            engine.step(np.array([0, 1, 2]), np.array([0, 1, 2, 3]), np.zeros(3, np.int32), logits)
        except (InvalidBatchError, TypeError) as e:
            errors.append(str(e))
    replays_before = dict(engine.stats()["replays"])
    out = engine.step(np.array([0, 1, 2]), np.array([0, 1, 2, 3]), np.zeros(3, np.int32), shard)
    tokens = out.sampled_token_ids[:, 0].tolist()
    full_parts = [torch.empty_like(shard) for _ in range(world)]
    torch.distributed.all_gather(full_parts, shard)
    full = torch.cat(full_parts, dim=1)
    want = full[:, : cfg.vocab_size].argmax(dim=1).tolist()
    return errors, replays_before, tokens, want


def test_bad_input_raises_identically_on_every_rank_and_nothing_hangs():
    # With the agreement check on, a tensor every rank refuses raises everywhere and leaves the
    # engine usable (without it the refusing rank gives up: see tests/engine/test_faults.py).
    cfg = SMALL.replace(max_num_logits_per_req=2, num_logprobs=0, check_agreement=True)
    results = spawn(_bad_inputs_then_good, 2, cfg, timeout_s=300)
    (e0, r0, tok0, want0), (e1, r1, tok1, want1) = results
    assert len(e0) == 8 and e0 == e1
    assert "strictly increasing" in e0[0] and "above max_num_logits_per_req" in e0[1]
    assert "appears more than once" in e0[2] and "out of range" in e0[3] and "add_request" in e0[4]
    assert "float32" in e0[5] and "[3, " in e0[6]
    assert all(count == 0 for count in r0.values())  # no bad batch reached a graph
    assert tok0 == tok1 == want0 == want1


def test_single_process_engine_matches_oracle_with_and_without_capture():
    cfg = SMALL.replace(transport="auto")
    for capture in (False, True):
        result = run_rank(0, 1, cfg, DemoSettings(steps=25, seed=3, capture=capture))
        assert result["verified"] == 25
        assert (result["eager_steps"] == 25) != capture


def test_fallback_error_refuses_large_batches_before_running():
    cfg = SMALL.replace(fallback="error", max_num_logits_per_req=1, num_logprobs=0)
    engine = Engine(cfg)
    engine.capture()
    for slot in range(10):
        engine.add_request(slot, SamplingParams())
    n = 9
    before = engine.records.clone()
    with pytest.raises(BatchTooLargeError, match="exceeds the largest captured bucket"):
        engine.step(np.arange(n), np.arange(n + 1), np.zeros(n, np.int32), torch.randn(n, engine.vocab_shard))
    assert torch.equal(before, engine.records)


def test_zero_copy_logits_and_step_outputs_are_views():
    cfg = SMALL.replace(max_num_logits_per_req=1, num_logprobs=0)
    engine = Engine(cfg)
    engine.capture()
    for slot in range(4):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    static = engine.inputs.logits[:4]
    static.copy_(torch.randn(4, engine.vocab_shard))
    out = engine.step(np.arange(4), np.arange(5), np.zeros(4, np.int32), static)
    assert out.sampled_token_ids[:, 0].tolist() == static[:, : cfg.vocab_size].argmax(1).tolist()
    # Views of static buffers: the records, and at tp = 1 the step's contiguous token block.
    assert out.records.data_ptr() == engine.records.data_ptr()
    assert out.num_sampled.data_ptr() == engine.records.data_ptr() + 4  # word M = 1 of a record
    assert out.sampled_token_ids.data_ptr() == engine.host_records.tokens.data_ptr()


def test_logits_none_steps_the_logits_already_in_place():
    """`logits=None` samples what `inputs.logits` holds: the same records as passing that view,
    with one-row and multi-row requests, drafts and a bitmask; a bad draft tensor is still
    refused, and so are inconsistent replicated arrays."""
    cfg = SMALL.replace(buckets=(2, 4), num_logprobs=0)
    by_view, by_none = Engine(cfg), Engine(cfg)
    gen = torch.Generator().manual_seed(3)
    for engine in (by_view, by_none):
        engine.capture()
        for slot in range(4):
            engine.add_request(slot, SamplingParams(temperature=0.0 if slot % 2 else 0.8, seed=slot))
    words = by_view.inputs.bitmask_widths[0]
    for cu in ([0, 1, 2, 3], [0, 3, 4, 6]):
        num_logits, n = cu[-1], len(cu) - 1
        logits = torch.randn(num_logits, by_view.vocab_shard, generator=gen)
        drafts = torch.randint(0, cfg.vocab_size, (num_logits,), generator=gen, dtype=torch.int32)
        mask = torch.full((num_logits, words), -1, dtype=torch.int32)
        mask[0] = 0
        mask[0, 0] = 0b10110  # row 0 may only take tokens 1, 2 and 4
        args = (np.arange(n, dtype=np.int32), np.array(cu, np.int32), np.full(n, 7, np.int32))
        for engine in (by_view, by_none):
            engine.inputs.logits[:num_logits].copy_(logits)
        want = by_view.step(*args, by_view.inputs.logits[:num_logits], drafts, mask).to_host()
        got = by_none.step(*args, None, drafts, mask).to_host()
        assert np.array_equal(got.records, want.records)
        assert got.sampled_token_ids[0, 0] in (1, 2, 4)
    with pytest.raises(InvalidBatchError, match="draft_token_ids"):
        by_none.step(*args, None, drafts[:-1])
    with pytest.raises(InvalidBatchError):
        by_none.step(args[0], np.array([0, 1], np.int32), args[2], None)


def test_add_request_checks():
    engine = Engine(SMALL)
    with pytest.raises(ValueError, match="exceeds the config's num_logprobs"):
        engine.add_request(0, SamplingParams(num_logprobs=5))
    with pytest.raises(ValueError, match="out of range"):
        engine.add_request(SMALL.max_num_slots, SamplingParams())
    with pytest.raises(TypeError):
        engine.add_request(0, {"temperature": 1.0})
    with pytest.raises(ValueError, match="holds no request"):
        engine.remove_request(3)


def test_oracle_compare_reports_differences():
    cfg = SMALL
    wl = Workload(cfg, seed=1)
    tables = SlotTables(cfg.max_num_slots, "cpu")
    batch = wl.next_batch()
    while batch.num_reqs < 3:
        for slot, p in batch.added:
            tables.set(slot, p)
        batch = wl.next_batch()
    for slot, p in batch.added:
        tables.set(slot, p)
    full = wl.logits(batch, cfg.padded_vocab_size(1), torch.float32)
    kwargs = dict(idx_mapping=batch.idx_mapping, cu_num_logits=batch.cu_num_logits, seq_lens=batch.seq_lens,
                  tables=tables, layout=Engine(cfg).layout, vocab_size=cfg.vocab_size,
                  draft_token_ids=torch.from_numpy(batch.draft_token_ids))
    a = sample_unsharded(full, **kwargs)
    assert compare(a, sample_unsharded(full, **kwargs)) is None
    full[0, : cfg.vocab_size] = -1e9
    full[0, 5] = 1e9
    b = sample_unsharded(full, **kwargs)
    assert compare(a, b) is not None


def test_grammar_bitmask_of_padded_or_real_width():
    cfg = Config(vocab_size=30, vocab_pad_multiple=64, max_num_reqs=4, max_num_slots=8, buckets=(2, 4))
    engine = Engine(cfg)  # padded vocabulary 64: two bitmask words; the real 30 tokens need one
    engine.capture()
    for slot in range(2):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    logits = torch.randn(2, engine.vocab_shard)
    for words in (1, 2):
        mask = torch.zeros(2, words, dtype=torch.int32)
        mask[:, 0] = 1 << 20  # only token 20 allowed
        out = engine.step(np.arange(2), np.arange(3), np.zeros(2, np.int32), logits, grammar_bitmask=mask)
        assert out.sampled_token_ids[:, 0].tolist() == [20, 20]
    with pytest.raises(InvalidBatchError, match="grammar_bitmask must have shape"):
        engine.step(np.arange(2), np.arange(3), np.zeros(2, np.int32), logits,
                    grammar_bitmask=torch.zeros(2, 5, dtype=torch.int32))
    # Without a bitmask the next step is unconstrained again.
    out = engine.step(np.arange(2), np.arange(3), np.zeros(2, np.int32), logits)
    assert out.sampled_token_ids[:, 0].tolist() == logits[:, :30].argmax(1).tolist()
