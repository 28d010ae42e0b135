"""The host path: double-buffered staging, the cheap checks (sound against the exact ones), the
step clock that bounds steps in flight, and an engine whose steps read staged rows correctly."""

import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.engine.faults import FaultGuard, StepClock, StepFault, Watchdog
from graphshard.sample.params import SamplingParams
from graphshard.plan.staging import HEADER, SLICE, Staging, row_width
from graphshard.engine.readout import HostRecords
from graphshard.engine.validate import BatchChecker, BatchLimits, InvalidBatchError

CPU = torch.device("cpu")


def _batch(slots, rows_per_req=1, lens=None):
    idx = np.array(slots, np.int32)
    cu = np.arange(len(slots) + 1, dtype=np.int32) * rows_per_req
    return idx, cu, np.array(lens if lens is not None else [7] * len(slots), np.int32)


def _fetched(staging: Staging):
    """What the device side of the step sees: (n, bitmask_on, idx, cu, lens) of `meta`."""
    num_reqs, bitmask_on, idx, cu, lens = staging.views()
    n = int(num_reqs[0])
    return n, int(bitmask_on[0]), idx[:n].tolist(), cu[:n + 1].tolist(), lens[:n].tolist()


def _staged(batch, bitmask_on=0):
    idx, cu, lens = batch
    return len(idx), bitmask_on, idx.tolist(), cu.tolist(), lens.tolist()


@pytest.mark.parametrize("rows_per_req", [1, 3])
def test_each_step_fetches_its_own_row_with_two_steps_staged(rows_per_req):
    s = Staging(max_num_reqs=4, device=CPU)
    a, b, c = _batch([3, 1], rows_per_req, [5, 6]), _batch([2], rows_per_req, [9]), _batch([0, 2, 1], rows_per_req)
    s.write(0, *a, False)
    s.write(1, *b, True)  # staged while step 0 has not run yet
    s.fetch()
    assert _fetched(s) == _staged(a)
    s.signal_done()
    assert s.finished() == 0
    s.fetch()
    assert _fetched(s) == _staged(b, 1)
    s.signal_done()
    s.write(2, *c, False)  # reuses step 0's row
    s.fetch()
    assert _fetched(s) == _staged(c)
    s.signal_done()
    assert s.finished() == 2


# Sizes at the rows' slice edges: the first slice's last fit (39 at SLICE = 128), one more, a
# body ending exactly at a slice's end (125) and one past it, and the maximum.
FIRST_FIT = (SLICE - HEADER - 1) // 3
SLICE_END = next(n for n in range(FIRST_FIT + 1, 300) if (HEADER + 3 * n + 1) % SLICE == 0)
EDGE_SIZES = (0, 1, FIRST_FIT, FIRST_FIT + 1, SLICE_END, SLICE_END + 1, 300)


@given(sizes=st.lists(st.sampled_from(EDGE_SIZES), min_size=1, max_size=6),
       extra=st.sampled_from((0, 1, 60, 300)), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_a_step_fetched_through_its_buckets_slices_gets_its_own_inputs(sizes, extra, seed):
    """A bucket's graph pulls only the rows' leading slices a step of its size uses: every
    step, staged in either row while the other holds the previous step, is fetched whole, and
    the device copy past the pulled range is never written."""
    rng = np.random.default_rng(seed)
    s = Staging(max_num_reqs=300, device=CPU)
    for step, n in enumerate(sizes):
        batch = _batch(rng.integers(0, 1000, n).tolist(), 1, rng.integers(0, 5000, n).tolist())
        bucket = min(300, n + extra)
        s.write(step, *batch, bool(step % 3 == 1))
        s.copies.fill_(-7)
        s.fetch(bucket)
        assert _fetched(s) == _staged(batch, int(step % 3 == 1))
        assert (s.copies[2 * row_width(bucket):] == -7).all()
        s.signal_done()
    assert row_width(FIRST_FIT) == SLICE < row_width(FIRST_FIT + 1)


def test_pull_refuses_a_bucket_above_the_staging():
    s = Staging(max_num_reqs=4, device=CPU)
    for bad in (5, -1, 2.0, True):
        with pytest.raises(ValueError, match="max_reqs"):
            s.pull(bad)


@pytest.mark.parametrize("grid_for, tokens", [(1, 0), (700, 0), (1, 3), (700, 1)])
def test_publish_copies_each_steps_records_to_its_slot_then_signals_done(grid_for, tokens):
    """The step's last kernel at tp = 1 (`HostRecords.publish`): the first n records into the
    host slot of the step's parity, then the done word, also when several programs share the
    copy (700 requests x 16 words: 3 programs) and the last of them signals; and the first
    `tokens` words of each of them into the contiguous device block, nothing past n."""
    s = Staging(max_num_reqs=700, device=CPU)
    records = torch.arange(700 * 16, dtype=torch.int32).view(700, 16)
    host = HostRecords(records, s, s.views()[0], tokens_per_record=tokens)
    assert (host.tokens is None) == (tokens == 0)
    for step, n in enumerate((699, 3, 650)):
        s.write(step, *_batch(list(range(n))), False)
        s.fetch()
        records.add_(1)
        before = None if host.tokens is None else host.tokens.clone()
        host.publish(grid_for)
        assert s.finished() == step
        assert np.array_equal(host.rows(step, n), records[:n].numpy())
        assert not host.slots[step & 1, n:].any() or step > 1  # nothing past n in a fresh slot
        if tokens:
            assert host.tokens.is_contiguous() and host.tokens.shape == (700, tokens)
            assert torch.equal(host.tokens[:n], records[:n, :tokens])
            assert torch.equal(host.tokens[n:], before[n:])
    assert np.array_equal(host.rows(1, 3), (records[:3] - 1).numpy())  # step 1 kept its own


def test_publish_refuses_a_token_count_past_the_record():
    s = Staging(max_num_reqs=4, device=CPU)
    for bad in (-1, 17, 1.0, True):
        with pytest.raises(ValueError, match="tokens_per_record"):
            HostRecords(torch.zeros(4, 16, dtype=torch.int32), s, s.views()[0],
                        tokens_per_record=bad)


@pytest.mark.parametrize("m", [1, 3])
def test_a_steps_sampled_tokens_are_one_contiguous_block(m):
    """At tp = 1 `sampled_token_ids` is the step's own contiguous copy of its records' token ids
    (a loop's `.cpu()` of it is then one copy), equal to the records' tokens, for graph steps
    and steps above the largest bucket alike, before and after capture."""
    cfg = Config(vocab_size=200, vocab_pad_multiple=8, max_num_reqs=10, max_num_slots=12,
                 max_num_logits_per_req=m, buckets=(2, 4), graph_backend="emulated")
    engine = Engine(cfg)
    for slot in range(12):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    g = torch.Generator().manual_seed(m)
    rng = np.random.default_rng(m)
    for i, n in enumerate([3, 1, 2, 4, 7, 2, 10, 1]):
        if i == 2:
            engine.capture()
        rows = rng.integers(1, m + 1, n)
        cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        logits = torch.randn(int(cu[-1]), engine.vocab_shard, generator=g)
        idx = rng.choice(12, n, replace=False).astype(np.int32)
        out = engine.step(idx, cu, np.zeros(n, np.int32), logits)
        tokens = out.sampled_token_ids
        assert tokens.is_contiguous() and tokens.shape == (n, m)
        assert torch.equal(tokens, out.records[:, :m])
        host = engine.read()
        assert np.array_equal(host.sampled_token_ids, tokens.numpy())
        if m == 1:  # greedy: the argmax
            assert tokens[:, 0].tolist() == logits[:, :200].argmax(1).tolist()


def test_warm_up_runs_refetch_the_placeholder_and_keep_the_done_word():
    s = Staging(max_num_reqs=4, device=CPU)
    s.write(0, *_batch([1]), False)
    s.fetch()
    s.signal_done()
    placeholder = _batch([0, 1, 2, 3], lens=[0] * 4)
    s.write_both(0, *placeholder, False)  # as the last issued step
    for _ in range(3):
        s.fetch()
        assert _fetched(s) == _staged(placeholder)
        s.signal_done()
        assert s.finished() == 0
    nxt = _batch([2, 0])
    s.write(1, *nxt, False)
    s.fetch()
    assert _fetched(s) == _staged(nxt)


def _greedy(n_slots=12, **changes):
    cfg = Config(vocab_size=200, vocab_pad_multiple=8, max_num_reqs=8, max_num_slots=n_slots,
                 buckets=(2, 4), graph_backend="emulated", **changes)
    engine = Engine(cfg)
    for slot in range(n_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    return engine


def test_a_small_buckets_step_pulls_only_its_slices():
    """The engine's bucket graphs (and steps above the largest bucket) pull the rows' leading
    slices of their own size, and sample the right tokens."""
    cfg = Config(vocab_size=200, vocab_pad_multiple=8, max_num_reqs=200, max_num_slots=200,
                 buckets=(2, 60), graph_backend="emulated")
    engine = Engine(cfg)
    for slot in range(200):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    engine.capture()
    copies = engine.inputs.staged.copies
    for n, pulled in ((1, row_width(2)), (41, row_width(60)), (150, row_width(150))):
        logits = torch.zeros(n, engine.vocab_shard)
        logits[torch.arange(n), torch.arange(n) % 100] = 1.0
        copies.fill_(-7)
        engine.step(np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32),
                    np.zeros(n, np.int32), logits)
        assert (copies[2 * pulled:] == -7).all() and (copies[:2 * pulled] != -7).any()
        assert engine.read().sampled_token_ids[:, 0].tolist() == (np.arange(n) % 100).tolist()


def test_steps_before_and_after_a_late_capture_sample_their_own_batch():
    engine = _greedy()
    g = torch.Generator().manual_seed(0)
    for i, n in enumerate([3, 1, 6, 2, 4, 3]):
        if i == 3:
            engine.capture()  # stages placeholders after three eager steps
        logits = engine.inputs.logits[:n]
        logits.copy_(torch.randn(n, engine.vocab_shard, generator=g))
        idx = np.random.default_rng(i).choice(12, n, replace=False).astype(np.int32)
        out = engine.step(idx, np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32), logits)
        assert out.sampled_token_ids[:, 0].tolist() == logits[:, :200].argmax(1).tolist()
        assert engine.inputs.staged.finished() == i
    assert engine.stats()["eager_steps"] == 3 and sum(engine.stats()["replays"].values()) == 3


def test_stats_report_the_whole_capture():
    engine = _greedy()
    engine.capture()
    stats = engine.stats()
    assert stats["capture_s"] >= stats["graph_capture_s"] > 0
    assert stats["strategy"] == {2: "replicate", 4: "replicate"}  # tp = 1
    assert stats["strategy_timings_us"] == {}


# -- the cheap checks never accept what the exact ones refuse -----------------------------------
LIMITS = BatchLimits(max_num_reqs=6, max_num_logits_per_req=3, max_num_slots=10)
SMALL_INTS = st.integers(-3, 12)
EDGE_INTS = st.sampled_from([-2**31, -1, 0, 1, 2, 3, 4, 9, 10, 2**31 - 1])


def _checker(active, limits=LIMITS):
    checker = BatchChecker(limits)
    for slot in active:
        checker.activate(slot)
    return checker


@settings(deadline=None, max_examples=400)
@given(n=st.integers(0, 7), data=st.data(), active=st.sets(st.integers(0, 9)),
       m=st.sampled_from([1, 3]))
def test_the_cheap_checks_accept_only_what_the_exact_checks_accept(n, data, active, m):
    """Batches near valid ones (one thing off, or nothing) and arbitrary ones."""
    limits = BatchLimits(6, m, 10)
    ints = st.one_of(SMALL_INTS, EDGE_INTS)
    arrays = lambda k: st.lists(ints, min_size=k, max_size=k)  # noqa: E731
    if len(active) >= n and data.draw(st.booleans()):  # a valid batch
        idx = np.array(data.draw(st.permutations(sorted(active)))[:n], np.int32)
        counts = data.draw(st.lists(st.integers(1, m), min_size=n, max_size=n))
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        lens = np.array(data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)), np.int32)
        if n and data.draw(st.booleans()):  # one entry off
            which = data.draw(st.sampled_from([idx, cu, lens]))
            which[data.draw(st.integers(0, len(which) - 1))] = data.draw(ints)
    else:
        idx, cu, lens = (np.array(data.draw(arrays(k)), np.int32) for k in (n, n + 1, n))
    if data.draw(st.integers(0, 9)) == 0:
        cu = cu[:-1]
    checker = _checker(active, limits)
    for _ in range(2):  # the second call may answer from the cache of the first
        accepted = checker.accepts(idx, cu, lens)
        try:
            exact = checker.check_exactly(idx, cu, lens)
        except InvalidBatchError:
            exact = None
        if accepted:
            assert exact is not None and all(a is b for a, b in zip(exact, (idx, cu, lens)))


def test_the_slot_cache_forgets_a_removed_request():
    checker = _checker(range(10))
    batch = _batch([4, 2, 7])
    assert checker.accepts(*batch)
    checker.deactivate(2)
    assert not checker.accepts(*batch)
    with pytest.raises(InvalidBatchError, match="slot 2 holds no request"):
        checker.check(*batch)


def test_large_batches_take_the_vectorised_slot_test():
    checker = _checker(range(200), BatchLimits(150, 1, 200))
    idx = np.random.default_rng(1).choice(200, 150, replace=False).astype(np.int32)
    batch = (idx, np.arange(151, dtype=np.int32), np.zeros(150, np.int32))
    assert checker.accepts(*batch)
    for bad_slot in (idx[3], 250, -1):
        wrong = idx.copy()
        wrong[100] = bad_slot
        assert not checker.accepts(wrong, *batch[1:])
    checker.deactivate(int(idx[7]))
    assert not checker.accepts(*batch)


@settings(deadline=None, max_examples=60)
@given(data=st.data(), n=st.integers(20, 48), flaw=st.sampled_from(
    ["none", "duplicate", "inactive", "out_of_range", "negative"]))
def test_both_slot_tests_agree_with_the_exact_checks(data, n, flaw):
    """Batches on both sides of the set test's bound (the vectorised test above it)."""
    limits = BatchLimits(48, 1, 64)
    active = data.draw(st.sets(st.integers(0, 63), min_size=n, max_size=64))
    idx = np.array(data.draw(st.permutations(sorted(active)))[:n], np.int32)
    at = data.draw(st.integers(0, n - 1))
    idx[at] = {"none": idx[at], "duplicate": idx[(at + 1) % n], "out_of_range": 64,
               "negative": -5, "inactive": min(set(range(64)) - active, default=idx[at])}[flaw]
    checker = _checker(active, limits)
    batch = (idx, np.arange(n + 1, dtype=np.int32), np.zeros(n, np.int32))
    try:
        checker.check_exactly(*batch)
        valid = True
    except InvalidBatchError:
        valid = False
    assert checker.accepts(*batch) == valid


@settings(deadline=None, max_examples=80)
@given(data=st.data(), n=st.sampled_from([1, 2, 127, 128, 129, 200]), flaw=st.sampled_from(
    ["none", "empty_row", "too_many_rows", "first_not_zero", "negative", "wraps"]))
def test_both_row_count_tests_agree_with_the_exact_checks(data, n, flaw):
    """cu_num_logits on both sides of the loop test's bound (NumPy's above it)."""
    m = 3
    limits = BatchLimits(200, m, 256)
    counts = data.draw(st.lists(st.integers(1, m), min_size=n, max_size=n))
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    at = data.draw(st.integers(1, n))
    if flaw == "empty_row":
        cu[at] = cu[at - 1]
    elif flaw == "too_many_rows":
        cu[at:] += m
    elif flaw == "first_not_zero":
        cu[0] = data.draw(st.sampled_from([1, -1, 2**31 - 1]))
    elif flaw == "negative":
        cu[at] = -1
    elif flaw == "wraps":  # int32 differences that wrap: 2**31 - 1 rows, then 1 (as int32)
        cu[max(at - 1, 1)] = 2**31 - 1
        cu[max(at - 1, 1) + 1:] = -2**31 + np.arange(n - max(at - 1, 1))
    cu = cu.astype(np.int32)
    checker = _checker(range(n), limits)
    batch = (np.arange(n, dtype=np.int32), cu, np.zeros(n, np.int32))
    try:
        checker.check_exactly(*batch)
        valid = True
    except InvalidBatchError:
        valid = False
    assert valid == (flaw == "none")
    for _ in range(2):  # the second call may answer from the cache of the first
        assert checker.accepts(*batch) == valid


def test_the_cheap_tensor_test_accepts_only_what_tensor_error_accepts():
    engine = _greedy(max_num_logits_per_req=2)
    inp, vs = engine.inputs, engine.vocab_shard
    good = torch.zeros(4, vs)
    drafts, mask = torch.zeros(4, dtype=torch.int32), torch.zeros(4, inp.bitmask_widths[0], dtype=torch.int32)
    cases = [
        (good, None, None), (inp.logits[:4], drafts, mask), (inp.logits[1:5], None, None),
        (good.double(), None, None), (good[:, :-1], None, None), (good.t().contiguous().t(), None, None),
        (torch.zeros(1, vs), None, None), (inp.logits[:1], None, None), (good, inp.draft_token_ids[1:5], None),
        (good, drafts.long(), None), (good, None, mask[:, :1]), (good, None, inp.grammar_bitmask[:4]),
        (good, drafts[:3], None), (good.numpy(), None, None),
        # Another static buffer's memory, and drafts starting two words before theirs.
        (good, inp.grammar_bitmask.view(-1)[:4], None), (good, None, inp.logits.view(torch.int32)[:4, :mask.shape[1]]),
        (good, torch.as_strided(inp.draft_token_ids, (4,), (1,), inp.draft_token_ids.storage_offset() - 2), None),
    ]
    for logits, d, b in cases:
        rows = logits.shape[0]
        if inp.tensors_fit(logits, d, b, rows):
            assert inp.tensor_error(logits, d, b, rows) is None, (logits.shape, d, b)
    assert inp.tensors_fit(inp.logits[:4], drafts, mask, 4)  # the zero-copy path is the cheap one
    assert inp.tensors_fit(good, drafts, mask, 4)  # and tensors of the loop's own
    assert inp.tensors_fit(None, drafts, mask, 4) and inp.tensor_error(None, drafts, mask, 4) is None
    assert not inp.tensors_fit(None, drafts[:3], None, 4)
    assert inp.tensor_error(None, drafts[:3], None, 4) is not None
    assert not inp.tensors_fit(inp.logits[1:5], None, None, 4)


# -- the step clock ------------------------------------------------------------------------------
class _Group:
    def __init__(self):
        self.aborts = 0

    def _get_backend(self, device):
        return self

    def abort(self):
        self.aborts += 1


def test_a_step_in_flight_past_the_bound_aborts_the_group_once():
    done = np.full(1, 4, np.int64)
    clock, group = StepClock(done), _Group()
    watchdog = Watchdog(group, limit_s=0.4, clock=clock)
    clock.start(5)
    clock.start(6)  # two in flight; step 5 is the one to time
    time.sleep(1.0)
    assert watchdog.fault == "step 5 did not finish within 0.4 s of its issue" and group.aborts == 1
    assert watchdog.wait_step(5) == watchdog.fault and group.aborts == 1
    watchdog.close()


def test_finished_steps_are_never_overdue_and_waits_are_bounded():
    done = np.full(1, -1, np.int64)
    clock, group = StepClock(done), _Group()
    watchdog = Watchdog(group, limit_s=0.5, clock=clock)
    clock.start(0)
    done[0] = 0
    time.sleep(0.8)
    assert watchdog.fault is None and watchdog.wait_step(0) is None
    clock.start(1)
    start = time.monotonic()
    assert watchdog.wait_step(1) == "step 1 did not finish within 0.5 s of its issue"
    assert time.monotonic() - start < 1.5 and group.aborts == 1
    watchdog.close()


def test_admit_waits_for_the_step_before_the_previous_one_only():
    done = np.full(1, -1, np.int64)
    guard = FaultGuard(group=None, rank=0, world_size=1, device=torch.device("cuda", 0),
                       timeout_s=5.0, done=done)
    guard.admit(0)
    guard.admit(1)  # step 0 still running: no wait
    threading.Timer(0.3, lambda: done.__setitem__(0, 0)).start()
    start = time.monotonic()
    guard.admit(2)  # reuses step 0's staging row: waits for it
    assert 0.25 <= time.monotonic() - start < 5.0 and guard.clock.issued == 2


def test_admit_raises_a_transport_fault_seen_meanwhile():
    class Faulted:
        def fault(self):
            return "p2p rows barrier on rank 0 gave up after 5 s waiting for rank 1"

    done = np.full(1, 10, np.int64)
    guard = FaultGuard(group=None, rank=0, world_size=1, device=torch.device("cuda", 0),
                       timeout_s=5.0, transport=Faulted(), done=done)
    with pytest.raises(StepFault, match="step 3 failed on rank 0: p2p rows barrier"):
        guard.admit(4)
    with pytest.raises(StepFault, match="broken by an earlier fault"):
        guard.check_standing()
