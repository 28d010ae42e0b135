"""Malformed step input is refused before any work, names its mistake and changes nothing.

Each case draws a valid batch, breaks it in one way, and checks that `Engine.step` raises the
error the contract names, that no engine buffer, table or counter changed, and that the valid
batch then samples exactly what the unsharded oracle does. The same mistakes run on two gloo
ranks, where both must raise the same error and the valid steps between them stay exact.
"""

import random
import re
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable

import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.kernels import bitmask_words
from graphshard.sample.params import MIN_TEMPERATURE, SamplingParams, SlotTables
from graphshard.errors import BatchTooLargeError, InvalidParamsError, InvalidSlotError, InvalidTypeError
from graphshard.engine.validate import BatchLimits, InvalidBatchError, validate_batch

# Buckets stop at 4 below max_num_reqs 6 with fallback "error": batches of 5 or 6 pass the
# batch checks and are refused by the graph manager alone.
CFG = Config(vocab_size=90, vocab_pad_multiple=8, max_num_reqs=6, max_num_logits_per_req=3,
             max_num_slots=10, buckets=(1, 2, 4), graph_backend="emulated", num_logprobs=2,
             fallback="error")
M, V, SLOTS = CFG.max_num_logits_per_req, CFG.vocab_size, CFG.max_num_slots
ACTIVE = list(range(7))  # slots 7..9 never hold a request
KINDS = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.2, top_k=5),
         dict(temperature=0.7, top_p=0.8), dict(temperature=1.0, min_p=0.1)]


class Draw:
    """`random.Random`'s choice/randint/sample, drawn through Hypothesis (which reports them)."""

    def __init__(self, data):
        self.data = data

    def randint(self, a, b):
        return self.data.draw(st.integers(a, b))

    def choice(self, seq):
        return self.data.draw(st.sampled_from(list(seq)))

    def sample(self, seq, k):
        return self.data.draw(st.permutations(list(seq)))[:k]


@dataclass
class Batch:
    idx: Any
    cu: Any
    lens: Any
    full: torch.Tensor  # full-vocabulary logits [rows, padded vocab]; each rank steps its shard
    drafts: Any = None
    bitmask: Any = None
    tweak: Callable | None = None  # turns this rank's shard into the tensor actually passed

    def step(self, engine):
        lo = engine.tp_rank * engine.vocab_shard
        shard = self.full[:, lo:lo + engine.vocab_shard].contiguous()
        return engine.step(self.idx, self.cu, self.lens, self.tweak(shard) if self.tweak else shard,
                           draft_token_ids=self.drafts, grammar_bitmask=self.bitmask)


def build_engine(cfg=CFG, capture=True):
    """An engine and the oracle's copy of its slot tables, every ACTIVE slot holding a request."""
    engine, tables = Engine(cfg), SlotTables(cfg.max_num_slots, "cpu")
    if capture:
        engine.capture()
    for slot in ACTIVE:
        p = SamplingParams(**KINDS[slot % len(KINDS)], seed=1000 + slot,
                           num_logprobs=slot % (cfg.num_logprobs + 1))
        engine.add_request(slot, p)
        tables.set(slot, p)
    return engine, tables


def make_batch(r, n, padded_vocab):
    """A valid batch of n requests: random rows per request, positions, drafts and bitmask."""
    counts = [r.randint(1, M) for _ in range(n)]
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    lens = np.array([r.randint(0, 10**6) for _ in range(n)], np.int32)
    g = torch.Generator().manual_seed(r.randint(0, 2**31))
    full = torch.randn(int(cu[-1]), padded_vocab, generator=g) * 3
    drafts = bitmask = None
    if r.choice([False, True]):  # half the drafts are the argmax, so greedy rows accept some
        guess = torch.randint(-1, V, (len(full),), generator=g, dtype=torch.int32)
        argmax = full[:, :V].argmax(1).int()
        drafts = torch.where(torch.rand(len(full), generator=g) < 0.5, argmax, guess)
    if r.choice([False, True]):
        words = bitmask_words(padded_vocab)
        bits = torch.randint(0, 256, (len(full), 4 * words), generator=g, dtype=torch.uint8)
        bitmask = bits.view(torch.int32)  # any bit pattern, sign bit included
    return Batch(np.array(r.sample(ACTIVE, n), np.int32), cu, lens, full, drafts, bitmask)


# -- mistakes: each takes a valid batch and returns (bad batch, exception type, message regex) --
ARRAYS = ("idx", "cu", "lens")
NAMES = dict(idx="idx_mapping", cu="cu_num_logits", lens="seq_lens")


def cu_unsorted(b, r):
    """Request i gets 0 or fewer rows; later entries shift with it, down to int32's minimum
    (where an int32 difference would wrap)."""
    i = r.randint(0, len(b.idx) - 1)
    floor = 2**31 + int(b.cu[i])  # the k that puts cu[i + 1] at -2**31
    cu, k = b.cu.astype(np.int64), r.choice([0, 1, floor, r.randint(0, floor)])
    cu[i + 1:] -= cu[i + 1] - cu[i] + k
    return replace(b, cu=cu), InvalidBatchError, rf"strictly increasing.*request {i} has {-k}$"


def cu_oversized(b, r):  # request i gets M more rows (so above M), up to an int32-max last entry
    i, k = r.randint(0, len(b.idx) - 1), r.choice([M, r.randint(M, 2**31 - 1 - int(b.cu[-1]))])
    cu = b.cu.astype(np.int64)
    cu[i + 1:] += k
    return replace(b, cu=cu), InvalidBatchError, \
        rf"request {i} has {cu[i + 1] - cu[i]} logits rows, above max_num_logits_per_req \({M}\)"


def cu_misplaced(b, r):  # a wrong length, or a start other than 0 (negative included)
    if r.choice([False, True]):
        cu = b.cu[:-1] if r.choice([False, True]) else np.append(b.cu, b.cu[-1] + 1)
        return replace(b, cu=cu), InvalidBatchError, rf"n\+1 = {len(b.idx) + 1} entries, got {len(cu)}"
    k = r.choice([1, -1, r.randint(1, 2**20), -r.randint(1, 2**31)])
    return replace(b, cu=b.cu.astype(np.int64) + k), InvalidBatchError, rf"must start at 0, got {k}$"


def too_many_requests(b, r):
    n = r.randint(CFG.max_num_reqs + 1, 12)
    return replace(b, idx=np.arange(n), cu=np.arange(n + 1), lens=np.zeros(n, np.int32)), \
        InvalidBatchError, rf"batch of {n} requests exceeds max_num_reqs \({CFG.max_num_reqs}\)"


def above_bucket(b, r):  # every input valid; only the graphs are too small
    big = make_batch(r, r.randint(CFG.max_bucket + 1, CFG.max_num_reqs), b.full.shape[1])
    return big, BatchTooLargeError, rf"batch of {len(big.idx)} requests exceeds the largest captured"


def slot_duplicate(b, r):
    i, j = sorted(r.sample(range(len(b.idx)), 2))
    idx = b.idx.copy()
    idx[j] = idx[i]
    return replace(b, idx=idx), InvalidBatchError, rf"slot {idx[i]} appears more than once"


def slot_out_of_range(b, r):
    bad = r.choice([-1, -2**31, SLOTS, 2**31 - 1, r.randint(-2**31, -1), r.randint(SLOTS, 2**31 - 1)])
    idx = b.idx.copy()
    idx[r.randint(0, len(idx) - 1)] = bad
    return replace(b, idx=idx), InvalidBatchError, rf"slot {bad} in idx_mapping is out of range \[0, {SLOTS}"


def slot_unknown(b, r):  # in range, but no add_request for it
    slot, idx = r.choice(range(len(ACTIVE), SLOTS)), b.idx.copy()
    idx[r.randint(0, len(idx) - 1)] = slot
    return replace(b, idx=idx), InvalidBatchError, rf"slot {slot} holds no request; call add_request"


def seq_lens_wrong(b, r):
    if r.choice([False, True]):
        lens, v = b.lens.copy(), -r.randint(1, 2**31)
        lens[r.randint(0, len(lens) - 1)] = v
        return replace(b, lens=lens), InvalidBatchError, rf"seq_lens must be >= 0, got {v}$"
    lens = np.append(b.lens, 0)
    return replace(b, lens=lens), InvalidBatchError, rf"seq_lens must have n = {len(b.idx)} entries"


def array_wrong_type(b, r):
    """One replicated array as floats, bools, strings, bf16 or grad-tracking tensors, 2-D or 0-d,
    ragged, beyond int32, or a tensor off the host."""
    which = r.choice(ARRAYS)
    a, name = getattr(b, which), NAMES[which]
    how = r.choice(["float", "bool", "str", "bf16", "grad", "2d", "0d", "none", "ragged", "int64",
                    "bigint", "meta", "list_bool", "object_float", "masked"])
    i = r.randint(0, len(a) - 1)
    big = r.choice([2**31, -2**31 - 1, 2**40, 2**63 - 1])
    # Wrong dtypes raise InvalidTypeError (an InvalidBatchError and a TypeError); the rest the base.
    value, exc, message = {
        "float": (a.astype(np.float64), InvalidTypeError, "must hold integers, got dtype float64"),
        "bool": (a > 0, InvalidTypeError, "must hold integers, got dtype bool"),
        "str": (a.astype(str), InvalidTypeError, "must hold integers, got dtype <U"),
        "bf16": (torch.from_numpy(a).bfloat16(), InvalidTypeError,
                 "must hold integers, got dtype torch.bfloat16"),
        "grad": (torch.from_numpy(a).float().requires_grad_(), InvalidTypeError,
                 "must hold integers, got dtype torch.float"),
        "2d": (a[:, None], InvalidBatchError, r"must be 1-D .*got ndarray of shape \(\d+, 1\)"),
        "0d": (np.int32(a[0]), InvalidBatchError, r"must be 1-D .*shape \(\)"),
        "none": (None, InvalidBatchError, r"must be 1-D .*got NoneType"),
        "ragged": (a.tolist() + [[1]], InvalidBatchError, "must be a 1-D integer array, got list"),
        "int64": (np.append(a[:-1], big).astype(np.int64), InvalidBatchError, "has values outside int32"),
        "bigint": (a.tolist()[:-1] + [2**70], InvalidBatchError, "has values outside int32"),
        "meta": (torch.from_numpy(a).to("meta"), InvalidBatchError,
                 "must be a host array .* got a tensor on meta"),
        # NumPy would read the bool as 0 or 1, and drop the mask.
        "list_bool": (a.tolist()[:i] + [bool(a[i] > 0)] + a.tolist()[i + 1:], InvalidTypeError,
                      f"must hold integers, got bool {a[i] > 0} at position {i}$" if len(a) > 1
                      else "must hold integers, got dtype bool$"),  # one bool: an all-bool list
        "object_float": (np.array(a.tolist()[:i] + [float(a[i])] + a.tolist()[i + 1:], dtype=object),
                         InvalidTypeError, rf"must hold integers, got float .* at position {i} \(dtype object\)$"),
        "masked": (np.ma.array(a, mask=np.arange(len(a)) == i), InvalidBatchError, "has masked entries$"),
    }[how]
    return replace(b, **{which: value}), exc, f"^{name} {message}"


def logits_wrong(b, r):
    """This rank's shard with the wrong shape, dtype, device, strides or Python type."""
    rows = len(b.full)
    how = r.choice(["rows", "cols", "1d", "3d", "f64", "bf16", "int", "meta", "strided", "numpy",
                    "sparse_coo", "sparse_csr"])
    tweak, exc, message = {
        "rows": (lambda s: torch.cat([s, s[:1]]), InvalidBatchError, rf"logits must be \[{rows}, "),
        "cols": (lambda s: s[:, 1:], InvalidBatchError, rf"logits must be \[{rows}, "),
        "1d": (lambda s: s.flatten(), InvalidBatchError, rf"logits must be \[{rows}, "),
        "3d": (lambda s: s[None], InvalidBatchError, rf"logits must be \[{rows}, "),
        "f64": (lambda s: s.double(), InvalidTypeError, "logits must be torch.float32 .*got torch.float64"),
        "bf16": (lambda s: s.bfloat16(), InvalidTypeError, "logits must be torch.float32 .*got torch.bfloat16"),
        "int": (lambda s: s.int(), InvalidTypeError, "logits must be torch.float32 .*got torch.int32"),
        "meta": (lambda s: s.to("meta"), InvalidBatchError, "logits is on meta, the engine runs on cpu"),
        "strided": (lambda s: s.repeat_interleave(2, dim=1)[:, ::2], InvalidBatchError, "contiguous"),
        "numpy": (lambda s: s.numpy(), InvalidTypeError, "logits must be a torch.Tensor, got ndarray"),
        "sparse_coo": (lambda s: s.to_sparse(), InvalidTypeError,
                       r"^logits must be a dense \(strided\) tensor, got torch.sparse_coo$"),
        "sparse_csr": (lambda s: s.to_sparse_csr(), InvalidTypeError,
                       r"^logits must be a dense \(strided\) tensor, got torch.sparse_csr$"),
    }[how]
    return replace(b, tweak=tweak), exc, message


def side_input_wrong(b, r):
    """Drafts or bitmask with the wrong dtype, shape (bitmask width included), device or type."""
    rows, name = len(b.full), r.choice(["drafts", "bitmask"])
    words = bitmask_words(b.full.shape[1])
    good = torch.zeros((rows,) if name == "drafts" else (rows, words), dtype=torch.int32)
    arg = "draft_token_ids" if name == "drafts" else "grammar_bitmask"
    how = r.choice(["int64", "uint32", "shape", "meta", "numpy", "sparse"]
                   + (["width"] if name == "bitmask" else []))
    value, exc, message = {
        "int64": (good.long(), InvalidTypeError, f"{arg} must be int32, got torch.int64"),
        "uint32": (good.to(torch.uint32), InvalidTypeError, f"{arg} must be int32, got torch.uint32"),
        "shape": (good[:-1] if rows > 1 else good[None], InvalidBatchError,
                  rf"{arg} must have shape \[{rows}"),
        "width": (torch.zeros(rows, words + r.randint(1, 3), dtype=torch.int32), InvalidBatchError,
                  rf"{arg} must have shape \[{rows}, {words}\]"),
        "meta": (good.to("meta"), InvalidBatchError, f"{arg} is on meta"),
        "numpy": (good.numpy(), InvalidTypeError, f"{arg} must be a torch.Tensor, got ndarray"),
        "sparse": (good.to_sparse(), InvalidTypeError,
                   rf"^{arg} must be a dense \(strided\) tensor, got torch.sparse_coo$"),
    }[how]
    return replace(b, **{name: value}), exc, message


REPLICATED = [cu_unsorted, cu_oversized, cu_misplaced, too_many_requests, above_bucket, slot_duplicate,
              slot_out_of_range, slot_unknown, seq_lens_wrong, array_wrong_type]
MISTAKES = {f.__name__: f for f in REPLICATED + [logits_wrong, side_input_wrong]}


# -- engine state ------------------------------------------------------------------------------
def snapshot(engine) -> dict:
    """A copy of everything a step could write: static buffers, slot tables, counters."""
    inp = engine.inputs
    tensors = {"meta": inp.meta, "staging": inp.staging, "logits": inp.logits,
               "drafts": inp.draft_token_ids, "bitmask": inp.grammar_bitmask, "records": engine.records,
               "local_records": engine.local_records, "workspace": engine.workspace.partials,
               **{f"plan.{k}": v for k, v in engine.plan_buffers.as_dict().items()},
               **{f"slots.{k}": v for k, v in vars(engine.tables).items() if isinstance(v, torch.Tensor)}}
    # Bytes, not values: NaN != NaN, and -0.0 == 0.0.
    snap = {k: t.detach().clone().contiguous().view(torch.uint8) for k, t in tensors.items()
            if t is not None}
    snap["active"] = engine.checker.active.copy()
    stats = engine.stats()
    snap["counters"] = (stats["replays"], stats["eager_fallbacks"], engine.eager_steps, engine.steps)
    return snap


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def changed_since(before: dict, engine) -> list[str]:
    """Names of the snapshot entries that differ now."""
    after = snapshot(engine)
    return [k for k, v in before.items() if not _same(v, after[k])]


def oracle_mismatch(engine, tables, b: Batch) -> str | None:
    """Step the valid batch; None when it equals the unsharded oracle, else the difference."""
    out = b.step(engine)
    want = sample_unsharded(b.full, idx_mapping=b.idx, cu_num_logits=b.cu, seq_lens=b.lens,
                            tables=tables, layout=engine.layout, vocab_size=V,
                            draft_token_ids=b.drafts, grammar_bitmask=b.bitmask)
    return compare(out, want)


def try_mistake(engine, tables, r, name):
    """Break a fresh valid batch, step it, then step the valid one: what each step gave."""
    n = r.randint(2 if name == "slot_duplicate" else 1, CFG.max_bucket)
    good = make_batch(r, n, engine.vocab)
    return attempt(engine, tables, good, *MISTAKES[name](good, r))


def attempt(engine, tables, good, bad, exc, pattern):
    """Step the bad batch, then the valid one: what each step gave."""
    before = snapshot(engine)
    try:
        bad.step(engine)
        raised = None
    except Exception as e:  # noqa: BLE001 - any other type is reported, not hidden
        raised = e
    return dict(expected=(exc.__name__, pattern),
                raised=None if raised is None else (type(raised).__name__, str(raised)),
                changed=changed_since(before, engine), oracle=oracle_mismatch(engine, tables, good))


def assert_refused_cleanly(result: dict):
    (exc, pattern), raised = result["expected"], result["raised"]
    assert raised is not None and raised[0] == exc, f"expected {exc}, got {raised}"
    assert re.search(pattern, raised[1]), f"message {raised[1]!r} does not match {pattern!r}"
    assert not result["changed"], f"the refused step changed {result['changed']}"
    assert result["oracle"] is None, f"the next valid step differs from the oracle: {result['oracle']}"


@pytest.fixture(scope="module")
def engine_and_tables():
    engine, tables = build_engine()
    oracle_mismatch(engine, tables, make_batch(random.Random(0), 3, engine.vocab))  # dirty buffers
    return engine, tables


# Every example runs a sampling step under the interpreter: shrinking would take minutes, and
# the failing draws are printed anyway.
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("name", sorted(MISTAKES))
@settings(deadline=None, max_examples=5, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(data=st.data())
def test_mistake_is_refused_and_changes_nothing(engine_and_tables, name, data):
    assert_refused_cleanly(try_mistake(*engine_and_tables, Draw(data), name))


def test_drafts_without_speculative_rows_are_refused():
    engine, _ = build_engine(CFG.replace(max_num_logits_per_req=1), capture=False)
    before = snapshot(engine)
    with pytest.raises(InvalidBatchError, match="draft_token_ids given but max_num_logits_per_req is 1"):
        engine.step(np.arange(2), np.arange(3), np.zeros(2, np.int32),
                    torch.zeros(2, engine.vocab_shard), draft_token_ids=torch.zeros(2, dtype=torch.int32))
    assert not changed_since(before, engine)


UNSUPPORTED = "grammar_bitmask given but the config has grammar_bitmask = false"


def _refuse_unsupported(rank, world, cfg):
    """An engine without bitmask support refuses a bitmask (and one without speculative rows
    refuses drafts) on every rank alike, changing nothing; its next steps equal the oracle's."""
    engine, tables = build_engine(cfg)
    assert engine.inputs.grammar_bitmask is None
    results = []
    for seed in range(3):
        good = replace(make_batch(random.Random(seed), 1 + seed, engine.vocab), bitmask=None)
        bad = [replace(good, bitmask=torch.zeros(len(good.full), bitmask_words(engine.vocab),
                                                  dtype=torch.int32))]
        if cfg.max_num_logits_per_req == 1:
            good = replace(good, cu=np.arange(len(good.idx) + 1, dtype=np.int32),
                           full=good.full[:len(good.idx)], drafts=None)
            bad = [replace(good, bitmask=bad[0].bitmask[:len(good.idx)]),
                   replace(good, drafts=torch.zeros(len(good.idx), dtype=torch.int32))]
        else:
            good = replace(good, drafts=None)
        for b in bad:
            before = snapshot(engine)
            try:
                b.step(engine)
                raised = None
            except InvalidBatchError as e:
                raised = str(e)
            results.append((raised, changed_since(before, engine)))
        out = good.step(engine)
        want = sample_unsharded(good.full, idx_mapping=good.idx, cu_num_logits=good.cu,
                                seq_lens=good.lens, tables=tables, layout=engine.layout,
                                vocab_size=V, bitmask_support=False)
        results.append(compare(out, want))
    return results


@pytest.mark.parametrize("tp, rows", [(1, M), (2, 1)])
def test_what_the_config_leaves_no_room_for_is_refused_on_every_rank(tp, rows):
    cfg = CFG.replace(grammar_bitmask=False, max_num_logits_per_req=rows, fallback="eager")
    per_rank = [_refuse_unsupported(0, 1, cfg)] if tp == 1 else \
        spawn(_refuse_unsupported, tp, cfg, timeout_s=900)
    for results in per_rank:
        assert results == per_rank[0]
        refusals = [r for r in results if isinstance(r, tuple)]
        assert len(refusals) == 3 * (2 if rows == 1 else 1)
        for raised, changed in refusals:
            assert raised in (UNSUPPORTED, "draft_token_ids given but max_num_logits_per_req is 1")
            assert not changed
        assert [r for r in results if not isinstance(r, tuple)] == [None] * 3


@pytest.mark.parametrize("cu, message", [
    ([0, 2, -2**31], r"strictly increasing.*request 1 has -2147483650$"),  # wraps to +2**31 - 2
    ([0, 5, -2**31 + 3], r"^request 0 has 5 logits rows"),  # request 1 would wrap to 2**31 - 2
])
def test_counts_are_named_exactly_at_the_int32_limits(cu, message):
    with pytest.raises(InvalidBatchError, match=message):
        validate_batch(np.array([0, 1]), np.array(cu), np.zeros(2, np.int32), BatchLimits(4, M, SLOTS))


# -- tensors that pass a naive check but would corrupt the static buffers ------------------------
def test_logits_that_require_grad_leave_no_autograd_state():
    engine, tables = build_engine(capture=False)
    b = replace(make_batch(random.Random(1), 2, engine.vocab), tweak=lambda s: s.requires_grad_())
    try:
        assert oracle_mismatch(engine, tables, b) is None
    except (InvalidBatchError, TypeError):
        pass  # refusing them would do as well
    assert not engine.inputs.logits.requires_grad


@pytest.mark.parametrize("which", ["logits", "drafts", "bitmask"])
def test_overlapping_views_of_the_static_inputs_are_refused(which):
    engine, _ = build_engine(capture=False)
    b, inp = make_batch(random.Random(1), 2, engine.vocab), engine.inputs
    rows = slice(1, 1 + len(b.full))  # the static buffer shifted by one row
    bad = {"logits": dict(tweak=lambda s: inp.logits[rows]), "drafts": dict(drafts=inp.draft_token_ids[rows]),
           "bitmask": dict(bitmask=inp.grammar_bitmask[rows])}[which]
    before = snapshot(engine)
    with pytest.raises(InvalidBatchError):
        replace(b, **bad).step(engine)
    assert not changed_since(before, engine)


def _aliases(inp, rows: int) -> dict:
    """Tensors over the static buffers' memory through a second storage object (as a NumPy or
    DLPack round trip makes them), each other than the buffer's leading rows."""
    def apart(buf):  # starts where the buffer does, its rows two apart
        a = buf.numpy()
        return torch.from_numpy(np.lib.stride_tricks.as_strided(
            a, (rows,) + a.shape[1:], (2 * a.strides[0],) + a.strides[1:]))

    def shifted(buf, elements):  # the buffer's layout, `elements` further on
        a = buf.numpy()
        return torch.from_numpy(a.reshape(-1)[elements:elements + rows * a[0].size]
                                .reshape((rows,) + a.shape[1:]))
    words = inp.grammar_bitmask.shape[1]
    return {"logits_shifted": dict(tweak=lambda s: shifted(inp.logits, inp.logits.shape[1])),
            "logits_apart": dict(tweak=lambda s: apart(inp.logits)),
            "drafts_shifted": dict(drafts=shifted(inp.draft_token_ids, 1)),
            "drafts_apart": dict(drafts=apart(inp.draft_token_ids)),
            "bitmask_shifted": dict(bitmask=shifted(inp.grammar_bitmask, words)),
            "bitmask_by_a_word": dict(bitmask=shifted(inp.grammar_bitmask, 1))}


@pytest.mark.parametrize("which", ["logits_shifted", "logits_apart", "drafts_shifted", "drafts_apart",
                                   "bitmask_shifted", "bitmask_by_a_word"])
def test_aliases_of_the_static_inputs_through_another_storage_are_refused(engine_and_tables, which):
    """Overlap is judged by address ranges, not by storage objects: the step would copy the
    buffer onto itself."""
    engine, tables = engine_and_tables
    good = make_batch(random.Random(3), 3, engine.vocab)
    bad = replace(good, **_aliases(engine.inputs, len(good.full))[which])
    arg = {"logits": "logits", "drafts": "draft_token_ids", "bitmask": "grammar_bitmask"}[which.split("_")[0]]
    assert_refused_cleanly(attempt(engine, tables, good, bad, InvalidBatchError,
                                   rf"^{arg} overlaps the engine's static {arg} buffer but is not its leading rows"))


def _strays(inp, rows: int) -> dict:
    """Tensors over another static buffer's memory, or starting before their own buffer and
    running into it (the buffers lie in one allocation: logits, drafts, then bitmask)."""
    words = inp.grammar_bitmask.shape[1]
    lead_in = (inp.grammar_bitmask.data_ptr() - inp.draft_token_ids.data_ptr()) // 4 - 1
    padded = lead_in >= inp.draft_token_ids.numel()  # that word lies past the drafts' end
    return {"bitmask_over_drafts": (dict(bitmask=torch.as_strided(inp.draft_token_ids, (rows, words), (words, 1))),
                                    "grammar_bitmask", "draft_token_ids"),
            "drafts_over_bitmask": (dict(drafts=inp.grammar_bitmask.view(-1)[:rows]),
                                    "draft_token_ids", "grammar_bitmask"),
            "drafts_over_logits": (dict(drafts=inp.logits.view(torch.int32).view(-1)[:rows]),
                                   "draft_token_ids", "logits"),
            "bitmask_over_logits": (dict(bitmask=inp.logits.view(torch.int32).view(-1)[-rows * words:]
                                         .view(rows, words)), "grammar_bitmask", "logits"),
            # One word before the bitmask buffer: alignment padding, or the drafts' last word.
            "bitmask_running_in": (dict(bitmask=torch.as_strided(inp.draft_token_ids, (rows, words), (words, 1),
                                                                 inp.draft_token_ids.storage_offset() + lead_in)),
                                   "grammar_bitmask", "grammar_bitmask" if padded else "draft_token_ids")}


@pytest.mark.parametrize("path", ["fast", "exact"])
@pytest.mark.parametrize("which", ["bitmask_over_drafts", "drafts_over_bitmask", "drafts_over_logits",
                                   "bitmask_over_logits", "bitmask_running_in"])
def test_tensors_over_another_static_input_or_running_into_their_own_are_refused(engine_and_tables, which, path):
    engine, tables = engine_and_tables
    good = make_batch(random.Random(6), 3, engine.vocab)
    change, arg, other = _strays(engine.inputs, len(good.full))[which]
    assert engine.inputs.grammar_bitmask.shape[1] * len(good.full) > 1  # runs past its first word
    bad = replace(good, **change)
    if path == "exact":
        bad = replace(bad, idx=bad.idx.tolist())
    tail = "but is not its leading rows" if other == arg else r"\(the step's copies into its buffers"
    assert_refused_cleanly(attempt(engine, tables, good, bad, InvalidBatchError,
                                   rf"^{arg} overlaps the engine's static {other} buffer {tail}"))


@pytest.mark.parametrize("storage", ["view", "numpy"])
def test_the_leading_rows_of_the_static_inputs_are_accepted(engine_and_tables, storage):
    """The zero-copy path: the buffers' leading rows, as views or through a second storage."""
    engine, tables = engine_and_tables
    inp = engine.inputs
    lead = (lambda buf, rows: buf[:rows]) if storage == "view" else \
        (lambda buf, rows: torch.from_numpy(buf.numpy()[:rows]))
    r = random.Random(4)
    good = make_batch(r, 3, engine.vocab)
    while good.drafts is None or good.bitmask is None:
        good = make_batch(r, 3, engine.vocab)
    rows = len(good.full)
    drafts, bitmask = lead(inp.draft_token_ids, rows), lead(inp.grammar_bitmask, rows)
    drafts.copy_(good.drafts)
    bitmask.copy_(good.bitmask)
    b = replace(good, drafts=drafts, bitmask=bitmask,
                tweak=lambda s: lead(inp.logits, rows).copy_(s))
    assert oracle_mismatch(engine, tables, b) is None


NON_STRIDED = {
    "logits_coo": (dict(tweak=lambda s: s.to_sparse()), "logits", "torch.sparse_coo"),
    "logits_csr": (dict(tweak=lambda s: s.to_sparse_csr()), "logits", "torch.sparse_csr"),
    "logits_csc": (dict(tweak=lambda s: s.to_sparse_csc()), "logits", "torch.sparse_csc"),
    "logits_mkldnn": (dict(tweak=lambda s: s.to_mkldnn()), "logits", "torch._mkldnn"),
    "drafts_coo": (dict(drafts="coo"), "draft_token_ids", "torch.sparse_coo"),
    "bitmask_coo": (dict(bitmask="coo"), "grammar_bitmask", "torch.sparse_coo"),
    "bitmask_csr": (dict(bitmask="csr"), "grammar_bitmask", "torch.sparse_csr"),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("path", ["fast", "exact"])  # "exact": a list idx_mapping skips the cheap tests
@pytest.mark.parametrize("which", sorted(NON_STRIDED))
def test_non_strided_tensors_are_refused_by_type(engine_and_tables, which, path):
    if which.endswith("mkldnn") and not torch.backends.mkldnn.is_available():
        pytest.skip("no mkldnn in this torch build")
    engine, tables = engine_and_tables
    good = make_batch(random.Random(5), 3, engine.vocab)
    change, arg, layout = NON_STRIDED[which]
    rows, words = len(good.full), bitmask_words(engine.vocab)
    sparse = {"coo": torch.Tensor.to_sparse, "csr": torch.Tensor.to_sparse_csr}
    if "drafts" in change:
        change = dict(drafts=sparse[change["drafts"]](torch.zeros(rows, dtype=torch.int32)))
    elif "bitmask" in change:
        change = dict(bitmask=sparse[change["bitmask"]](torch.full((rows, words), -1, dtype=torch.int32)))
    bad = replace(good, **change)
    if path == "exact":
        bad = replace(bad, idx=bad.idx.tolist())
    assert_refused_cleanly(attempt(engine, tables, good, bad, InvalidTypeError,
                                   rf"^{arg} must be a dense \(strided\) tensor, got {layout}$"))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
def test_nested_tensors_are_refused_by_type(engine_and_tables):
    engine, _ = engine_and_tables
    inp, rows = engine.inputs, 2
    nested = torch.nested.nested_tensor
    for args, arg in [((nested([torch.zeros(engine.vocab_shard)] * rows), None, None), "logits"),
                      ((None, nested([torch.zeros(1, dtype=torch.int32)] * rows), None), "draft_token_ids"),
                      ((None, None, nested([torch.zeros(3, dtype=torch.int32)] * rows)), "grammar_bitmask")]:
        error = inp.tensor_error(*args, rows)
        assert isinstance(error, InvalidTypeError)
        assert str(error) == f"{arg} must be a dense (strided) tensor, got a nested tensor"
    # Through step(): the fast path's shape test raises torch's own error on a nested tensor.
    idx, cu, lens = np.array(ACTIVE[:rows], dtype=np.int32), np.arange(rows + 1, dtype=np.int32), \
        np.zeros(rows, dtype=np.int32)
    steps = engine.steps
    with pytest.raises(InvalidTypeError, match="logits must be a dense"):
        engine.step(idx, cu, lens, nested([torch.zeros(engine.vocab_shard)] * rows))
    assert engine.steps == steps


def test_a_replicated_error_takes_precedence_over_a_tensor_error(engine_and_tables):
    engine, _ = engine_and_tables
    big = replace(make_batch(random.Random(2), CFG.max_num_reqs, engine.vocab), tweak=lambda s: s.double())
    with pytest.raises(BatchTooLargeError):
        big.step(engine)


# -- sampling parameters -------------------------------------------------------------------------
FLOATS, INTS = ("temperature", "top_p", "min_p"), ("top_k", "seed", "num_logprobs")
ANY_NUMBER = st.one_of(st.floats(), st.floats(-1e-44, 1e-29), st.integers(-2**70, 2**70),
                       st.sampled_from([True, False, np.float32(0.5), np.int64(3), np.bool_(True)]))
NOT_A_NUMBER = st.one_of(st.none(), st.text(max_size=3), st.just(1 + 2j), st.just([0.5]),
                         st.just(torch.tensor(0.5)))


@settings(deadline=None, max_examples=300)
@given(field=st.sampled_from(FLOATS + INTS), value=st.one_of(ANY_NUMBER, NOT_A_NUMBER))
def test_sampling_params_refuse_clearly_or_fit_the_tables(field, value):
    """Every value is either refused naming its field, or stored exactly as the kernels need it."""
    try:
        params = SamplingParams(**{field: value})
    except (TypeError, ValueError) as e:
        assert str(e).startswith(f"SamplingParams.{field} = "), e
        return
    tables = SlotTables(1, "cpu")
    tables.set(0, params)
    t, top_p, min_p = (float(getattr(tables, f)[0]) for f in FLOATS)
    assert t == 0.0 or MIN_TEMPERATURE / 2 < t < float("inf")  # fp32 keeps it positive and finite
    assert 0.0 < top_p <= 1.0 and 0.0 <= min_p <= 1.0
    assert int(tables.top_k[0]) == params.top_k and int(tables.num_logprobs[0]) == params.num_logprobs
    assert type(getattr(params, field)) is (float if field in FLOATS else int)  # no NumPy scalars kept


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", -1e-3),
    ("temperature", 1e-40), ("temperature", 1e300), ("temperature", 10**400), ("temperature", True),
    ("top_p", float("nan")), ("top_p", 0.0), ("top_p", 1e-46), ("top_p", float("-inf")), ("top_p", False),
    ("min_p", float("nan")), ("min_p", -0.1), ("min_p", float("inf")), ("top_k", 2**31), ("top_k", 1.0),
    ("seed", -1), ("seed", 2**63), ("seed", True), ("num_logprobs", -1), ("num_logprobs", 2**31)])
def test_non_finite_or_out_of_range_params_are_refused(field, value):
    with pytest.raises((TypeError, ValueError), match=rf"^SamplingParams\.{field} = "):
        SamplingParams(**{field: value})


TINY = Fraction(1, 10**400)  # a positive real below float64's range


@pytest.mark.parametrize("field, value", [("temperature", TINY), ("temperature", -TINY),
                                          ("top_p", TINY), ("min_p", TINY), ("temperature", "longdouble")])
def test_nonzero_values_that_round_to_zero_as_floats_are_refused(field, value):
    """Stored as 0 they would mean greedy sampling (temperature) or a filter switched off."""
    if value == "longdouble":
        value = np.longdouble("1e-4000")
        if value == 0:
            pytest.skip("long double is float64 here")
    with pytest.raises(InvalidParamsError, match=rf"^SamplingParams\.{field} = .*: is nonzero but "
                                                 rf"rounds to 0 as a float$"):
        SamplingParams(**{field: value})
    if field != "top_p":  # a true 0 is still 0 (greedy, no min_p filter)
        assert getattr(SamplingParams(**{field: Fraction(0)}), field) == 0.0


@pytest.mark.parametrize("field, value", [("temperature", TINY), ("temperature", 10**400),
                                          ("top_k", 10**400), ("seed", -10**400)])
def test_params_errors_cut_long_values(field, value):
    with pytest.raises(InvalidParamsError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(f"SamplingParams.{field} = {repr(value)[:40]}...: ") and len(message) < 160


@settings(deadline=None, max_examples=60)
@given(slot=st.one_of(st.integers(-2**70, -1), st.integers(SLOTS, 2**70), st.floats(), st.booleans(),
                      st.none(), st.text(max_size=2), st.sampled_from([np.int64(SLOTS), np.float64(1)])),
       params=st.one_of(st.none(), st.just({"temperature": 1.0}), st.builds(SamplingParams)))
def test_add_request_refuses_bad_slots_and_params(engine_and_tables, slot, params):
    engine, _ = engine_and_tables
    before = snapshot(engine)
    with pytest.raises((InvalidSlotError, InvalidTypeError), match="slot|params must be SamplingParams"):
        engine.add_request(slot, params)
    with pytest.raises(InvalidSlotError, match="holds no request"):
        engine.remove_request(slot)
    with pytest.raises(InvalidParamsError, match="exceeds the config's num_logprobs"):
        engine.add_request(0, SamplingParams(num_logprobs=CFG.num_logprobs + 1))
    assert not changed_since(before, engine)


# -- two ranks -----------------------------------------------------------------------------------
def _every_replicated_mistake(rank, world, seed):
    """The same mistakes on every rank (one seed), each followed by a valid step."""
    engine, tables = build_engine(CFG)
    r = random.Random(seed)
    return [try_mistake(engine, tables, r, f.__name__) for f in REPLICATED]


def test_replicated_mistakes_raise_the_same_on_every_rank_and_the_next_step_is_exact():
    """Extends tests/engine/test_engine.py's check (five kinds, then one greedy step) to every kind of
    replicated mistake, each followed by a sharded step compared with the oracle."""
    r0, r1 = spawn(_every_replicated_mistake, 2, 7, timeout_s=300)
    for f, a, b in zip(REPLICATED, r0, r1):
        if f is slot_unknown:
            # The one refusal that depends on a rank's own slots: with the divergence check (the
            # default) the ranks run the step, its results discarded, to learn that every rank
            # refused alike (RELIABILITY.md, "A missed add_request"). The same error, no request
            # gained or lost, and the next step exact.
            for result in (a, b):
                result["changed"] = [k for k in result["changed"]
                                     if k.startswith("slots.") or k == "active"]
        assert a == b  # same errors, same messages, same (empty) changes
        assert_refused_cleanly(a)
