"""Compiled Triton kernels on a GPU: equal to their NumPy references, one compilation per shape family."""

import numpy as np
import pytest
import torch

from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.plan.kernel import _fetch_plan_kernel, _plan_kernel, fetch_and_plan, plan
from graphshard.plan.layout import PLAN_FIELDS, PlanBuffers
from graphshard.plan.reference import plan_ref
from graphshard.sample.records import RecordLayout, unpack
from graphshard.sample.kernels import sample
from graphshard.sample.reference import sample_ref
from graphshard.plan.staging import Staging

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _compiled_variants(kernel, device) -> int:
    return len(kernel.device_caches[device.index if device.index is not None else 0][0])


def test_plan_kernel_equals_reference_and_compiles_once():
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = np.random.default_rng(0)
    max_reqs, max_m, tp = 1024, 4, 4
    buf = PlanBuffers.allocate(max_reqs, max_m, tp, dev)
    before = None
    for trial in range(30):
        n = int(rng.choice([0, 1, 7, 100, 513, max_reqs]))
        slots = rng.choice(4 * max_reqs, n, replace=False).astype(np.int32)
        counts = rng.integers(1, max_m + 1, n)
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        lens = rng.integers(0, 5000, n).astype(np.int32)
        drafts = rng.integers(0, 100, max_reqs * max_m).astype(np.int32)
        stride = int(rng.integers(max(n, 1), 2 * max_reqs))
        rank = int(rng.integers(0, tp))

        def pad(a, length):
            out = np.zeros(length, np.int32)
            out[: a.shape[0]] = a
            return torch.from_numpy(out).to(dev)

        for t in buf.as_dict().values():
            t.fill_(-7)
        plan(buf, idx_mapping=pad(slots, max_reqs), cu_num_logits=pad(cu, max_reqs + 1),
             seq_lens=pad(lens, max_reqs), num_reqs=torch.tensor([n], dtype=torch.int32, device=dev),
             tp_rank=rank, gather_stride=stride, max_num_logits_per_req=max_m,
             draft_token_ids=torch.from_numpy(drafts).to(dev))
        ref = plan_ref(slots, cu, lens, tp_size=tp, tp_rank=rank, max_num_reqs=max_reqs,
                       max_num_logits_per_req=max_m, gather_stride=stride, draft_token_ids=drafts)
        for name in PLAN_FIELDS:
            np.testing.assert_array_equal(getattr(buf, name).cpu().numpy(), ref[name], err_msg=name)
        if trial == 0:
            before = _compiled_variants(_plan_kernel, dev)
    # Ranks differ (a constexpr), n and stride do not: at most one binary per rank seen.
    assert _compiled_variants(_plan_kernel, dev) - before <= tp - 1


def test_fused_fetch_and_plan_equals_reference_and_compiles_once():
    """The shard step's first kernel: it reads the staged rows' device copy, stores it
    into meta, and plans from meta in the same program (a block barrier between the two)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = np.random.default_rng(1)
    max_reqs, max_m, tp = 1024, 4, 2
    staging = Staging(max_reqs, dev)
    buf = PlanBuffers.allocate(max_reqs, max_m, tp, dev)
    drafts = torch.from_numpy(rng.integers(0, 100, max_reqs * max_m).astype(np.int32)).to(dev)
    before = None
    for step in range(30):
        n = int(rng.choice([0, 1, 7, 100, 513, max_reqs]))
        slots = rng.choice(4 * max_reqs, n, replace=False).astype(np.int32)
        cu = np.concatenate([[0], np.cumsum(rng.integers(1, max_m + 1, n))]).astype(np.int32)
        lens = rng.integers(0, 5000, n).astype(np.int32)
        stride = int(rng.integers(max(n, 1), 2 * max_reqs))
        rank = step % tp
        torch.cuda.synchronize(dev)  # the row staged two steps ago is free again
        staging.write(step, slots, cu, lens, False)
        for t in buf.as_dict().values():
            t.fill_(-7)
        fetch_and_plan(staging, buf, tp_rank=rank, gather_stride=stride,
                       max_num_logits_per_req=max_m, draft_token_ids=drafts)
        staging.signal_done()
        ref = plan_ref(slots, cu, lens, tp_size=tp, tp_rank=rank, max_num_reqs=max_reqs,
                       max_num_logits_per_req=max_m, gather_stride=stride,
                       draft_token_ids=drafts.cpu().numpy())
        for name in PLAN_FIELDS:
            np.testing.assert_array_equal(getattr(buf, name).cpu().numpy(), ref[name], err_msg=name)
        assert staging.finished() == step
        if step == 1:
            before = _compiled_variants(_fetch_plan_kernel, dev)
    assert _compiled_variants(_fetch_plan_kernel, dev) == before  # one binary per rank


@pytest.mark.parametrize("vocab, dtype, K, M", [(152064, torch.float32, 0, 1), (152064, torch.bfloat16, 3, 2),
                                                 (128256, torch.float16, 0, 3), (32000, torch.bfloat16, 5, 1)])
def test_sampler_equals_float64_reference(vocab, dtype, K, M):
    dev = torch.device("cuda", torch.cuda.current_device())
    rng = np.random.default_rng(vocab + K)
    n, slots_total = 24, 64
    padded = -(-vocab // 128) * 128
    counts = rng.integers(1, M + 1, n)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    rows = int(cu[-1])
    logits = (torch.from_numpy(rng.standard_normal((rows, padded)).astype(np.float32)) * 3).to(dtype)
    logits[:, vocab:] = 1e4
    slots = rng.choice(slots_total, n, replace=False).astype(np.int32)
    lens = rng.integers(0, 3000, n).astype(np.int32)
    kinds = [SamplingParams(temperature=0.0, num_logprobs=min(K, 2)), SamplingParams(temperature=0.9, seed=3),
             SamplingParams(temperature=0.7, top_k=40, seed=5, num_logprobs=K),
             SamplingParams(temperature=1.1, top_p=0.8, seed=7), SamplingParams(temperature=1.0, min_p=0.05, seed=9),
             SamplingParams(temperature=0.8, top_k=100, top_p=0.9, min_p=0.02, seed=11, num_logprobs=K)]
    params = {int(s): kinds[i % len(kinds)] for i, s in enumerate(slots)}
    tables = SlotTables(slots_total, dev)
    for s, p in params.items():
        tables.set(s, p)
    layout = RecordLayout(M, K)
    records = torch.full((n, layout.width), -5, dtype=torch.int32, device=dev)
    drafts = rng.integers(0, vocab, rows).astype(np.int32) if M > 1 else None
    to_dev = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    sample(logits.to(dev), vocab_size=vocab, num_reqs=torch.tensor([n], dtype=torch.int32, device=dev),
           req_slots=to_dev(slots), cu_num_logits=to_dev(cu), seq_lens=to_dev(lens), tables=tables,
           layout=layout, records=records, max_num_reqs=n,
           draft_tokens=to_dev(drafts) if drafts is not None else None)
    ref = sample_ref(logits.float().numpy(), vocab_size=vocab, req_slots=slots, cu_num_logits=cu,
                     seq_lens=lens, params=params, K=K, max_num_logits_per_req=M, draft_tokens=drafts)
    out = unpack(records.cpu(), layout)
    np.testing.assert_array_equal(out.sampled_token_ids.numpy(), ref["tokens"])
    np.testing.assert_array_equal(out.num_sampled.numpy(), ref["num_sampled"])
    np.testing.assert_array_equal(out.num_rejected.numpy(), ref["num_rejected"])
    if K:
        np.testing.assert_array_equal(out.topk_ids.numpy(), ref["topk_ids"])
        np.testing.assert_array_equal(out.sampled_rank.numpy(), ref["sampled_rank"])
        finite = np.isfinite(ref["topk_logprobs"])
        np.testing.assert_allclose(out.topk_logprobs.numpy()[finite], ref["topk_logprobs"][finite], atol=1e-3)


def test_divergence_digest_equals_its_reference():
    """The inputs hash and the seal kernel, compiled: the same words as the NumPy reference."""
    from tests.engine.test_divergence import (
        test_the_device_digest_equals_its_reference_and_sees_every_replicated_word as check)
    check(device="cuda")


def test_divergence_judge_that_ends_a_step():
    from tests.engine.test_divergence import (
        test_the_judge_that_ends_a_step_writes_the_verdict_before_the_done_word as check)
    check(device="cuda")
