import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import graphshard.plan.kernel as plan_mod
from graphshard.runtime.launch import specialization_key
from graphshard.plan.kernel import fetch_and_plan, plan
from graphshard.plan.layout import PLAN_FIELDS, PlanBuffers, owner_counts
from graphshard.plan.reference import plan_ref
from graphshard.plan.staging import Staging

POISON = -7


@st.composite
def batches(draw, single_owner=False):
    tp = draw(st.integers(1, 8))
    max_reqs = draw(st.integers(1, 12))
    max_m = draw(st.integers(1, 4))
    max_slots = draw(st.integers(max_reqs, 3 * max_reqs + 8))
    n = draw(st.sampled_from([0, max_reqs, draw(st.integers(0, max_reqs))]))
    if single_owner:
        d = draw(st.integers(0, tp - 1))
        pool = [s for s in range(max_slots * tp) if s % tp == d][: max(n, 1) * 2]
        max_slots = max(pool) + 1
    else:
        pool = list(range(max_slots))
    slots = draw(st.permutations(pool))[:n]
    counts = [draw(st.integers(1, max_m)) for _ in range(n)]
    seq_lens = [draw(st.integers(0, 10_000)) for _ in range(n)]
    return dict(tp=tp, max_reqs=max_reqs, max_m=max_m, n=n,
                slots=np.array(slots, np.int32), counts=np.array(counts, np.int64),
                seq_lens=np.array(seq_lens, np.int32), stride=draw(st.integers(max(1, max_reqs), 64)))


def padded(a, length, fill=12345):
    out = np.full(length, fill, np.int32)
    out[: a.shape[0]] = a
    return torch.from_numpy(out)


def run_kernel(b, rank, drafts):
    n, max_reqs, max_m = b["n"], b["max_reqs"], b["max_m"]
    cu = np.concatenate([[0], np.cumsum(b["counts"])]).astype(np.int32)
    buf = PlanBuffers.allocate(max_reqs, max_m, b["tp"], "cpu")
    for t in buf.as_dict().values():
        t.fill_(POISON)  # every entry must be written, including the padding
    plan(buf, idx_mapping=padded(b["slots"], max_reqs), cu_num_logits=padded(cu, max_reqs + 1),
         seq_lens=padded(b["seq_lens"], max_reqs), num_reqs=torch.tensor([n], dtype=torch.int32),
         tp_rank=rank, gather_stride=b["stride"], max_num_logits_per_req=max_m,
         draft_token_ids=torch.from_numpy(drafts))
    ref = plan_ref(b["slots"], cu, b["seq_lens"], tp_size=b["tp"], tp_rank=rank,
                   max_num_reqs=max_reqs, max_num_logits_per_req=max_m,
                   gather_stride=b["stride"], draft_token_ids=drafts)
    return {k: v.numpy() for k, v in buf.as_dict().items()}, ref, cu


def check_invariants(p, b, cu, rank):
    n, tp = b["n"], b["tp"]
    owner = b["slots"].astype(np.int64) % tp
    offs = p["owner_row_offsets"]
    for d in range(tp):
        rows = p["send_rows"][offs[d]:offs[d + 1]]
        expect = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in range(n) if owner[i] == d] or [[]])
        # Contiguous per destination, batch order, each request's rows consecutive.
        assert np.array_equal(rows, expect)
    # gathered_src_indices: a bijection from the batch onto the filled (owner, rank) cells.
    src = p["gathered_src_indices"][:n]
    cells = {(int(s) // b["stride"], int(s) % b["stride"]) for s in src}
    assert len(cells) == n
    for d in range(tp):
        ranks = sorted(r for o, r in cells if o == d)
        assert ranks == list(range(p["owner_num_reqs"][d]))
    local = np.flatnonzero(owner == rank)
    assert p["local_num_reqs"][0] == local.shape[0]
    assert np.array_equal(p["local_req_indices"][: local.shape[0]], local)


@settings(max_examples=40, deadline=None)
@given(batches(), st.data())
def test_kernel_equals_reference_every_rank(b, data):
    drafts = np.arange(b["max_reqs"] * b["max_m"], dtype=np.int32) * 7 + 3
    for rank in range(b["tp"]):
        got, ref, cu = run_kernel(b, rank, drafts)
        for name in PLAN_FIELDS:
            assert np.array_equal(got[name], ref[name]), (name, rank, got[name], ref[name])
        check_invariants(got, b, cu, rank)


@settings(max_examples=15, deadline=None)
@given(batches(single_owner=True))
def test_all_requests_on_one_owner(b):
    drafts = np.zeros(b["max_reqs"] * b["max_m"], dtype=np.int32)
    owner_reqs = None
    for rank in range(b["tp"]):
        got, ref, cu = run_kernel(b, rank, drafts)
        for name in PLAN_FIELDS:
            assert np.array_equal(got[name], ref[name]), name
        check_invariants(got, b, cu, rank)
        owner_reqs = got["owner_num_reqs"]
    assert (owner_reqs > 0).sum() <= 1  # every other shard is empty


def test_highest_slot_and_full_bucket():
    b = dict(tp=3, max_reqs=6, max_m=2, n=6, slots=np.array([29, 0, 28, 5, 27, 1], np.int32),
             counts=np.array([2, 1, 1, 2, 2, 1]), seq_lens=np.arange(6, dtype=np.int32), stride=6)
    drafts = np.arange(12, dtype=np.int32)
    for rank in range(3):
        got, ref, cu = run_kernel(b, rank, drafts)
        for name in PLAN_FIELDS:
            assert np.array_equal(got[name], ref[name]), name


def _record_specializations(monkeypatch) -> set:
    """The set that collects the specialization key of every plan-module launch from now on."""
    keys = set()
    real = plan_mod.launch

    def recording(kernel, grid, *args, **kwargs):
        keys.add(specialization_key(kernel, args, kwargs))
        return real(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(plan_mod, "launch", recording)
    return keys


def test_one_compilation_for_every_n_and_stride(monkeypatch):
    keys = _record_specializations(monkeypatch)
    max_reqs, max_m, tp = 16, 2, 2
    buf = PlanBuffers.allocate(max_reqs, max_m, tp, "cpu")
    idx = torch.arange(max_reqs, dtype=torch.int32)
    cu = torch.arange(max_reqs + 1, dtype=torch.int32)
    lens = torch.zeros(max_reqs, dtype=torch.int32)
    for n, stride in [(0, 1), (1, 1), (2, 16), (7, 8), (16, 16), (9, 32), (1, 17)]:
        plan(buf, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
             num_reqs=torch.tensor([n], dtype=torch.int32), tp_rank=1, gather_stride=stride,
             max_num_logits_per_req=max_m)
        assert buf.num_reqs[0] == n
    assert len(keys) == 1


def run_fused(b, rank, drafts, staging: Staging, step: int):
    """The shard step's first kernel: stage the batch as step `step`, fetch and plan in one go."""
    cu = np.concatenate([[0], np.cumsum(b["counts"])]).astype(np.int32)
    buf = PlanBuffers.allocate(b["max_reqs"], b["max_m"], b["tp"], "cpu")
    for t in buf.as_dict().values():
        t.fill_(POISON)
    staging.write(step, b["slots"], cu, b["seq_lens"], False)
    fetch_and_plan(staging, buf, tp_rank=rank, gather_stride=b["stride"],
                   max_num_logits_per_req=b["max_m"], draft_token_ids=torch.from_numpy(drafts))
    staging.signal_done()
    ref = plan_ref(b["slots"], cu, b["seq_lens"], tp_size=b["tp"], tp_rank=rank,
                   max_num_reqs=b["max_reqs"], max_num_logits_per_req=b["max_m"],
                   gather_stride=b["stride"], draft_token_ids=drafts)
    return {k: v.numpy() for k, v in buf.as_dict().items()}, ref, cu


@settings(max_examples=25, deadline=None)
@given(batches(), st.data())
def test_fused_fetch_and_plan_equals_reference_every_rank(b, data):
    """The same plan as the reference, from the inputs the fused kernel fetched itself; the
    fetched inputs are what `Staging.fetch` leaves in `meta` (the sampler reads them there)."""
    drafts = np.arange(b["max_reqs"] * b["max_m"], dtype=np.int32) * 5 + 1
    staging = Staging(b["max_reqs"], torch.device("cpu"))
    for step, rank in enumerate(range(b["tp"])):
        got, ref, cu = run_fused(b, rank, drafts, staging, step)
        for name in PLAN_FIELDS:
            assert np.array_equal(got[name], ref[name]), (name, rank, got[name], ref[name])
        check_invariants(got, b, cu, rank)
        n = b["n"]
        num_reqs, bitmask_on, idx, cu_dev, lens = staging.views()
        assert int(num_reqs[0]) == n and int(bitmask_on[0]) == 0
        assert idx[:n].tolist() == b["slots"].tolist()
        assert lens[:n].tolist() == b["seq_lens"].tolist()
        assert cu_dev[:n + 1].tolist() == cu.tolist() and staging.finished() == step


def test_fused_fetch_takes_the_row_of_the_step_with_two_staged():
    """Two steps staged before either runs: each fused launch plans its own step's batch."""
    staging = Staging(4, torch.device("cpu"))
    buf = PlanBuffers.allocate(4, 1, 2, "cpu")
    batches_ = [np.array([3, 1], np.int32), np.array([2], np.int32), np.array([0, 2, 1], np.int32)]

    def stage(step, idx):
        staging.write(step, idx, np.arange(len(idx) + 1, dtype=np.int32),
                      np.zeros(len(idx), np.int32), False)

    stage(0, batches_[0])
    stage(1, batches_[1])  # staged while step 0 has not run yet
    for step, idx in enumerate(batches_):
        if step == 2:  # reuses step 0's row once step 0 is done
            stage(2, idx)
        fetch_and_plan(staging, buf, tp_rank=1, gather_stride=4, max_num_logits_per_req=1)
        staging.signal_done()
        owned = [i for i, slot in enumerate(idx) if slot % 2 == 1]
        assert int(buf.num_reqs[0]) == len(idx)
        assert buf.local_req_indices[:len(owned)].tolist() == owned


def test_fused_kernel_compiles_once_for_every_n_and_stride(monkeypatch):
    keys = _record_specializations(monkeypatch)
    staging = Staging(16, torch.device("cpu"))
    buf = PlanBuffers.allocate(16, 2, 2, "cpu")
    for step, (n, stride) in enumerate([(0, 1), (1, 1), (2, 16), (7, 8), (16, 16), (9, 32)]):
        staging.write(step, np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32),
                      np.zeros(n, np.int32), False)
        fetch_and_plan(staging, buf, tp_rank=1, gather_stride=stride, max_num_logits_per_req=2)
        staging.signal_done()
        assert buf.num_reqs[0] == n
    assert len(keys) == 1


def test_launcher_refuses_bad_buffers():
    buf = PlanBuffers.allocate(4, 1, 2, "cpu")
    good = dict(idx_mapping=torch.zeros(4, dtype=torch.int32), cu_num_logits=torch.zeros(5, dtype=torch.int32),
                seq_lens=torch.zeros(4, dtype=torch.int32), num_reqs=torch.zeros(1, dtype=torch.int32),
                tp_rank=0, gather_stride=4, max_num_logits_per_req=1)
    with pytest.raises(TypeError, match="idx_mapping must be int32"):
        plan(buf, **{**good, "idx_mapping": torch.zeros(4, dtype=torch.int64)})
    with pytest.raises(ValueError, match="cu_num_logits must be a contiguous 1-D tensor of at least 5"):
        plan(buf, **{**good, "cu_num_logits": torch.zeros(4, dtype=torch.int32)})
    with pytest.raises(ValueError, match="tp_rank 2 out of range"):
        plan(buf, **{**good, "tp_rank": 2})
    with pytest.raises(ValueError, match="plan buffers hold 4 rows"):
        plan(buf, **{**good, "max_num_logits_per_req": 2})
    with pytest.raises(ValueError, match="seq_lens must be a contiguous"):
        plan(buf, **{**good, "seq_lens": torch.zeros(8, dtype=torch.int32)[::2]})


def test_owner_counts():
    reqs, rows = owner_counts(np.array([4, 1, 2, 7], np.int32), np.array([0, 1, 3, 4, 7], np.int32), 3)
    assert reqs.tolist() == [0, 3, 1] and rows.tolist() == [0, 6, 1]
