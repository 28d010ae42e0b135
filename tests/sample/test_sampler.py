"""The Triton sampler against its float64 NumPy reference, and the counter-based RNG.

Runs under the Triton interpreter on CPU (TRITON_INTERPRET=1) or compiled on a CUDA device.
Logits are normal * 3 so fp32-vs-fp64 near ties are negligible and tokens compare exactly.
Small tiles and chunks split every row over several programs of the split pass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings, strategies as st

from graphshard.sample import kernels as sampler, rng
from graphshard.runtime.launch import specialization_key
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout, unpack
from graphshard.sample.reference import sample_ref
from graphshard.sample.workspace import (NUM_PART, P_FLOOR_R, P_FLOOR_S, SMALL_ROW_CHUNK_TOP,
                                          SMALL_ROW_SPLITS)

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRET and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a CUDA device")

V = 200  # real vocabulary
PV = 256  # padded vocabulary
POISON = -123456789
NUM_SLOTS = 64
BLOCK = 64  # several vocab tiles per row, so cross-tile logic is exercised
CHUNK = 64  # four vocab splits per row (the last one partial), so the combination is exercised


# --------------------------------------------------------------------------- helpers


@dataclass
class Batch:
    logits: torch.Tensor  # [rows, padded_vocab]
    params: list  # SamplingParams per request
    counts: list  # logits rows per request
    seq_lens: list
    slots: list
    draft_tokens: np.ndarray | None = None  # [rows]
    bitmask: np.ndarray | None = None  # [bitmask_rows, words]
    bitmask_rows: np.ndarray | None = None  # [rows]

    @property
    def cu(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int32)


# `SamplerWorkspace.paths` of a launch whose rows all settled from their candidates.
NO_SLOW_PATHS = {"draw_fallback": 0, "logprobs_fallback": 0, "counted": 0, "deep": 0,
                 "deep_split": 0}


def make_logits(rs, rows, vocab=V, padded=PV, dtype=torch.float32, pad_value=1.0e4):
    x = (rs.standard_normal((rows, padded)) * 3).astype(np.float32)
    x[:, vocab:] = pad_value  # huge padding: must never win
    return torch.from_numpy(x).to(dtype)


def make_batch(rs, params, counts=None, dtype=torch.float32, **kw) -> Batch:
    """One request per entry of `params`, each in its own slot, drawn from NUM_SLOTS (from as
    many slots as requests in a larger batch; `run_kernel`'s slot tables grow to hold them)."""
    n = len(params)
    counts = counts if counts is not None else [1] * n
    slots = [int(s) for s in rs.choice(max(n, NUM_SLOTS), size=n, replace=False)]
    seq_lens = [int(s) for s in rs.integers(0, 5000, size=n)]
    return Batch(make_logits(rs, sum(counts), dtype=dtype), list(params), list(counts), seq_lens,
                 slots, **kw)


def i32(x, device=DEVICE):
    return torch.as_tensor(np.asarray(x, dtype=np.int32), device=device)


def run_kernel(b: Batch, *, M=1, K=0, vocab_size=V, max_num_reqs=None, n=None, slot_params=None,
               records=None, block_size=BLOCK, chunk_size=CHUNK, bitmask_enabled=None,
               workspace=None, splits_per_program=None, finish_programs=None):
    """Launch the sampler on `b` with padded request arrays; returns the records (CPU).

    Without `workspace`, one is allocated with `chunk_size`; `chunk_size=None` leaves the
    allocation to the launcher (default chunk)."""
    n = len(b.params) if n is None else n
    max_num_reqs = len(b.params) if max_num_reqs is None else max_num_reqs
    tables = SlotTables(max(NUM_SLOTS, max(b.slots, default=0) + 1), DEVICE)
    for slot, p in zip(b.slots, b.params):
        tables.set(slot, p)
    pad = max_num_reqs - len(b.params)
    cu = b.cu
    layout = RecordLayout(M, K)
    if records is None:
        records = torch.full((max_num_reqs + 2, layout.width), POISON, dtype=torch.int32)
    records = records.to(DEVICE)
    kwargs = {}
    if b.draft_tokens is not None:
        kwargs["draft_tokens"] = i32(b.draft_tokens)
    if b.bitmask is not None:
        kwargs["bitmask"] = i32(b.bitmask)
        kwargs["bitmask_rows"] = i32(b.bitmask_rows)
        if bitmask_enabled is not None:
            kwargs["bitmask_enabled"] = i32([bitmask_enabled])
    if workspace is None and chunk_size is not None:
        workspace = sampler.SamplerWorkspace.allocate(max_num_reqs, M, vocab_size, DEVICE,
                                                      chunk_size=chunk_size)
    sampler.sample(
        b.logits.to(DEVICE), vocab_size=vocab_size, num_reqs=i32([n]),
        req_slots=i32(list(b.slots) + [0] * pad),
        cu_num_logits=i32(np.concatenate([cu, [cu[-1]] * pad])),
        seq_lens=i32(list(b.seq_lens) + [0] * pad), tables=tables, layout=layout,
        records=records, max_num_reqs=max_num_reqs, workspace=workspace, block_size=block_size,
        splits_per_program=splits_per_program, finish_programs=finish_programs, **kwargs)
    if workspace is not None:
        # The next launch captures into these: a word left set would be read as its count.
        assert (workspace.fill == 0).all(), "a launch left a pool word set"
    return records.cpu(), layout


def run_ref(b: Batch, *, M=1, K=0, vocab_size=V):
    return sample_ref(
        b.logits.float().numpy(), vocab_size=vocab_size, req_slots=b.slots, cu_num_logits=b.cu,
        seq_lens=b.seq_lens, params=dict(zip(b.slots, b.params)), K=K,
        max_num_logits_per_req=M, draft_tokens=b.draft_tokens, bitmask=b.bitmask,
        bitmask_rows=b.bitmask_rows)


def assert_same(records, layout, ref):
    n = ref["tokens"].shape[0]
    out = unpack(records[:n], layout)
    np.testing.assert_array_equal(out.sampled_token_ids.numpy(), ref["tokens"])
    np.testing.assert_array_equal(out.num_sampled.numpy(), ref["num_sampled"])
    np.testing.assert_array_equal(out.num_rejected.numpy(), ref["num_rejected"])
    np.testing.assert_array_equal(out.num_nans.numpy(), ref["num_nans"])
    if layout.num_logprobs > 0:
        np.testing.assert_array_equal(out.topk_ids.numpy(), ref["topk_ids"])
        np.testing.assert_array_equal(out.sampled_rank.numpy(), ref["sampled_rank"])
        for name in ("topk_logprobs", "sampled_logprob"):
            got, want = getattr(out, name).numpy().astype(np.float64), ref[name]
            np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=name)
            finite = np.isfinite(want)
            np.testing.assert_allclose(got[finite], want[finite], atol=1e-4, err_msg=name)
    return out


def check(b: Batch, **kw):
    records, layout = run_kernel(b, **kw)
    kw = {k: v for k, v in kw.items() if k in ("M", "K", "vocab_size")}
    return assert_same(records, layout, run_ref(b, **kw))


def row_samples(b: Batch, vocab_size=V) -> list[np.ndarray]:
    """Every row's own sample, per request: each row sampled as a one-row request at its
    position."""
    cu, out = b.cu, []
    for j, m in enumerate(b.counts):
        rows = range(cu[j], cu[j] + m)
        single = Batch(b.logits[cu[j]:cu[j] + m], [b.params[j]] * m, [1] * m,
                       [b.seq_lens[j] + r for r in range(m)], [b.slots[j]] * m,
                       bitmask=b.bitmask, bitmask_rows=None if b.bitmask_rows is None
                       else b.bitmask_rows[list(rows)])
        out.append(run_ref(single, vocab_size=vocab_size)["tokens"][:, 0])
    return out


def random_params(rs, kind: str, num_logprobs: int = 0) -> SamplingParams:
    seed = int(rs.integers(0, 2**63))
    t = float(rs.choice([0.5, 0.8, 1.0, 1.5]))
    if kind == "greedy":
        return SamplingParams(temperature=0.0, num_logprobs=num_logprobs)
    if kind == "temperature":
        return SamplingParams(temperature=t, seed=seed, num_logprobs=num_logprobs)
    if kind == "top_k":
        return SamplingParams(temperature=t, top_k=int(rs.choice([1, 2, 5, 17, 199, 200, 500])),
                              seed=seed, num_logprobs=num_logprobs)
    if kind == "top_p":
        return SamplingParams(temperature=t, top_p=float(rs.choice([0.05, 0.3, 0.7, 0.9, 0.99])),
                              seed=seed, num_logprobs=num_logprobs)
    if kind == "min_p":
        return SamplingParams(temperature=t, min_p=float(rs.choice([0.001, 0.05, 0.2, 0.9, 1.0])),
                              seed=seed, num_logprobs=num_logprobs)
    assert kind == "combined"
    return SamplingParams(temperature=t, top_k=int(rs.choice([0, 3, 20, 60])),
                          top_p=float(rs.choice([0.5, 0.8, 0.95, 1.0])),
                          min_p=float(rs.choice([0.0, 0.01, 0.1])), seed=seed,
                          num_logprobs=num_logprobs)


def drafts_accepting(samples, counts, accept, vocab=V) -> np.ndarray:
    """Draft tokens [rows] int32 under which request j accepts exactly `accept[j]` drafts: its
    rows' own samples, the one at `accept[j]` changed (unless every draft is accepted)."""
    drafts = []
    for smp, m, a in zip(samples, counts, accept):
        d = np.array(smp, dtype=np.int64)
        if a < m - 1:
            d[a] = (d[a] + 1) % vocab
        drafts.append(d)
    return np.concatenate(drafts).astype(np.int32)


def full_bitmask(rows: int, vocab=V) -> np.ndarray:
    return np.full((rows, sampler.bitmask_words(vocab)), -1, dtype=np.int32)


def set_allowed(mask_row: np.ndarray, tokens) -> None:
    mask_row[:] = 0
    for t in tokens:
        w = mask_row[t // 32].astype(np.int64) & 0xFFFFFFFF
        w |= 1 << (t % 32)
        mask_row[t // 32] = np.int64(w).astype(np.uint32).view(np.int32)


# --------------------------------------------------------------------------- RNG


@triton.jit
def _rng_probe_kernel(seed_lo_ptr, seed_hi_ptr, pos_ptr, tok_ptr, bits_ptr, u_ptr, g_ptr,
                      N: tl.constexpr):
    offs = tl.arange(0, N)
    seed_lo = tl.load(seed_lo_ptr + offs)
    seed_hi = tl.load(seed_hi_ptr + offs)
    pos = tl.load(pos_ptr + offs)
    tok = tl.load(tok_ptr + offs)
    bits = rng.random_bits(seed_lo, seed_hi, pos, tok)
    tl.store(bits_ptr + offs, bits.to(tl.int32, bitcast=True))
    tl.store(u_ptr + offs, rng.uniform(bits))
    tl.store(g_ptr + offs, rng.gumbel(rng.row_key(seed_lo, seed_hi, pos), tok))


@triton.jit
def _uniform_probe_kernel(bits_ptr, u_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    bits = tl.load(bits_ptr + offs).to(tl.uint32, bitcast=True)
    tl.store(u_ptr + offs, rng.uniform(bits))


@triton.jit
def _gumbel_probe_kernel(g_ptr, BLOCK: tl.constexpr):
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(g_ptr + b, rng.gumbel_of(b.to(tl.uint32, bitcast=True) << 9))


def test_gumbel_close_to_float64_at_every_uniform():
    """Every one of the 2**23 uniforms: the device's Gumbel value within 3e-7 of max(|g|, 4) of
    the float64 one (about two units in the last place of a score plus g), finite, and
    largest at the largest uniform (the winners' end, where a log of u would lose digits)."""
    n, block = 2**23, 2**15
    g = torch.empty(n, dtype=torch.float32, device=DEVICE)
    _gumbel_probe_kernel[(n // block,)](g, BLOCK=block)
    g = g.cpu().numpy().astype(np.float64)
    want = -np.log(-np.log(rng.uniform_np(np.arange(n, dtype=np.uint32) << np.uint32(9))))
    assert np.isfinite(g).all()
    err = np.abs(g - want) / np.maximum(np.abs(want), 4.0)
    assert err.max() <= 3e-7, (err.max(), want[err.argmax()])
    assert g.argmax() == n - 1


def test_rng_device_and_numpy_bit_identical():
    rs = np.random.default_rng(1)
    n = 1024
    edges = np.array([0, 1, -1, 2**31 - 1, -2**31], dtype=np.int64)
    cols = []
    for hi in (2**31, 2**31, 2**31, 300_000):
        c = rs.integers(-hi if hi == 2**31 else 0, hi, size=n).astype(np.int64)
        c[:5] = edges if hi == 2**31 else np.abs(edges) % hi
        cols.append(c.astype(np.int32))
    seed_lo, seed_hi, pos, tok = cols
    bits, u, g = (torch.empty(n, dtype=d, device=DEVICE) for d in (torch.int32, torch.float32,
                                                                    torch.float32))
    _rng_probe_kernel[(1,)](*(i32(c) for c in cols), bits, u, g, N=n)
    want = rng.random_bits_np(seed_lo, seed_hi, pos, tok)
    np.testing.assert_array_equal(bits.cpu().numpy().view(np.uint32), want)
    np.testing.assert_array_equal(u.cpu().numpy().astype(np.float64), rng.uniform_np(want))
    g_np = rng.gumbel_np(rng.row_key_np(seed_lo, seed_hi, pos), tok)
    np.testing.assert_allclose(g.cpu().numpy(), g_np, rtol=1e-5, atol=1e-5)
    assert len(np.unique(want)) > n - 3  # no structural collisions


def test_rng_uniforms_strictly_inside_unit_interval():
    bits = np.array([0, 1, 511, 512, 2**31, 2**32 - 512, 2**32 - 1, 2**32 - 2], dtype=np.uint32)
    u = torch.empty(8, dtype=torch.float32, device=DEVICE)
    _uniform_probe_kernel[(1,)](i32(bits.view(np.int32)), u, N=8)
    u = u.cpu().numpy()
    assert (u > 0).all() and (u < 1).all()
    np.testing.assert_array_equal(u.astype(np.float64), rng.uniform_np(bits))
    assert np.isfinite(-np.log(-np.log(u))).all()
    many = rng.uniform_np(rng.random_bits_np(7, 9, np.arange(50_000), 3))
    assert 0 < many.min() and many.max() < 1
    assert abs(many.mean() - 0.5) < 0.01
    # Neighbouring tokens and positions are uncorrelated.
    a = rng.uniform_np(rng.random_bits_np(7, 9, 11, np.arange(50_000)))
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.02
    assert abs(np.corrcoef(a, many)[0, 1]) < 0.02


def test_rng_keys_split_seed_halves():
    lo, hi = rng.split_seed(2**40 + 2**31 + 5)
    assert (lo, hi) == (-(2**31) + 5, 256)
    t = SlotTables(1, "cpu")
    t.set(0, SamplingParams(seed=2**40 + 2**31 + 5))
    assert (int(t.seed_lo[0]), int(t.seed_hi[0])) == (lo, hi)


# --------------------------------------------------------------------------- sampling vs reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_matches_reference(dtype):
    rs = np.random.default_rng(2)
    b = make_batch(rs, [random_params(rs, "greedy") for _ in range(6)], dtype=dtype)
    # An exact tie across tiles and within one lane of a tile: the lowest id wins.
    b.logits[0, :V] = -5.0
    b.logits[0, [135, 71, 7, 70]] = 9.0
    out = check(b)
    assert out.sampled_token_ids[0, 0] == 7
    assert (out.sampled_token_ids[:, 0] < V).all()


@pytest.mark.parametrize("kind", ["temperature", "top_k", "top_p", "min_p", "combined"])
def test_random_sampling_matches_reference(kind):
    rs = np.random.default_rng(sum(map(ord, kind)))
    b = make_batch(rs, [random_params(rs, kind) for _ in range(8)])
    check(b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_match_reference(dtype):
    rs = np.random.default_rng(3)
    kinds = ["temperature", "top_k", "top_p", "min_p", "combined", "greedy"]
    b = make_batch(rs, [random_params(rs, k, num_logprobs=3) for k in kinds], dtype=dtype)
    check(b, K=3)


def test_filters_restrict_the_support():
    """top_k=1, min_p=1 and a tiny top_p keep only the top token; greedy ignores filters."""
    rs = np.random.default_rng(4)
    params = [SamplingParams(temperature=1.0, top_k=1, seed=1),
              SamplingParams(temperature=2.0, min_p=1.0, seed=2),
              SamplingParams(temperature=0.7, top_p=1e-6, seed=3),
              SamplingParams(temperature=0.0, top_k=3, top_p=0.2, min_p=0.5, seed=4)]
    b = make_batch(rs, params)
    out = check(b)
    np.testing.assert_array_equal(out.sampled_token_ids[:, 0].numpy(),
                                  b.logits[:, :V].float().argmax(dim=1).numpy())


def test_bitmask_matches_reference():
    rs = np.random.default_rng(5)
    kinds = ["greedy", "temperature", "top_k", "top_p", "min_p", "combined", "greedy",
             "temperature"]
    b = make_batch(rs, [random_params(rs, k) for k in kinds])
    rows = len(kinds)
    mask = (rs.integers(0, 2**32, size=(rows + 1, sampler.bitmask_words(V)), dtype=np.uint64)
            .astype(np.uint32).view(np.int32))
    set_allowed(mask[0], [123])  # greedy, one token allowed
    set_allowed(mask[1], [3])  # random, one token allowed
    set_allowed(mask[2], [31, 32])
    set_allowed(mask[3], [])  # nothing allowed: token 0
    b.bitmask = mask
    b.bitmask_rows = np.array([0, 1, 2, 3, 4, 5, 6, 4], dtype=np.int32)
    out = check(b)
    assert out.sampled_token_ids[0, 0] == 123
    assert out.sampled_token_ids[1, 0] == 3
    assert out.sampled_token_ids[2, 0] in (31, 32)
    assert out.sampled_token_ids[3, 0] == 0
    for j in range(4, rows):
        t = int(out.sampled_token_ids[j, 0])
        word = int(mask[b.bitmask_rows[j], t // 32]) & 0xFFFFFFFF
        assert (word >> (t % 32)) & 1


@pytest.mark.parametrize("enabled", [0, 1])
def test_bitmask_switched_by_a_device_flag(enabled):
    rs = np.random.default_rng(15)
    b = make_batch(rs, [random_params(rs, k) for k in ("greedy", "temperature", "combined")])
    mask = np.zeros((3, sampler.bitmask_words(V)), dtype=np.int32)
    for row, token in enumerate([7, 8, 9]):
        set_allowed(mask[row], [token])
    b.bitmask, b.bitmask_rows = mask, np.arange(3, dtype=np.int32)
    records, layout = run_kernel(b, bitmask_enabled=enabled)
    if enabled:
        want = run_ref(b)
    else:
        b.bitmask, b.bitmask_rows = None, None  # flag off: exactly the unconstrained result
        want = run_ref(b)
    out = assert_same(records, layout, want)
    if enabled:
        assert out.sampled_token_ids[:, 0].tolist() == [7, 8, 9]


def test_nan_rows_counted():
    rs = np.random.default_rng(6)
    params = [random_params(rs, k) for k in ("greedy", "temperature", "combined", "top_p")]
    b = make_batch(rs, params, counts=[3, 1, 2, 3])
    b.logits[0, 5] = float("nan")
    b.logits[2, [0, 199]] = float("nan")
    b.logits[3, :V] = float("nan")  # request 1's only row: no finite score, samples token 0
    b.logits[4, V + 3] = float("nan")  # padding: not counted
    b.logits[6:9, 150] = float("nan")  # all of request 3
    out = check(b, M=3)
    np.testing.assert_array_equal(out.num_nans.numpy(), [2, 1, 0, 3])
    assert out.sampled_token_ids[1, 0] == 0


@pytest.mark.parametrize("infs", [[7], [150, 7, 199], [3, 64, 65, 130]])
def test_posinf_rows_sample_their_first_posinf_token(infs):
    """+inf (an overflowed half-precision head) holds all of the row's mass in every mode: the
    lowest-id +inf token among the allowed ones wins, the logprobs are NaN, nothing is counted
    as NaN."""
    rs = np.random.default_rng(len(infs))
    kinds = ["greedy", "temperature", "top_k", "top_p", "min_p", "combined", "min_p", "greedy"]
    params = [random_params(rs, k, num_logprobs=2) for k in kinds]
    params[4] = SamplingParams(temperature=0.8, min_p=0.05, seed=11, num_logprobs=2)
    b = make_batch(rs, params)
    b.logits[:, infs] = float("inf")
    mask = full_bitmask(len(kinds) + 1)
    set_allowed(mask[1], [t for t in range(V) if t != min(infs)])  # the first +inf disallowed
    b.bitmask = mask
    b.bitmask_rows = np.array([0, 0, 0, 0, 0, 0, 1, 1], dtype=np.int32)
    out = check(b, K=2)
    first, second = sorted(infs)[0], (sorted(infs)[1] if len(infs) > 1 else None)
    tokens = out.sampled_token_ids[:, 0].tolist()
    assert tokens[:6] == [first] * 6
    if second is not None:
        assert tokens[6:] == [second] * 2
    assert out.num_nans.tolist() == [0] * len(kinds)
    assert np.isnan(out.sampled_logprob[:6, 0].numpy()).all()


def test_speculative_acceptance_with_drafts():
    rs = np.random.default_rng(7)
    M = 4
    kinds = ["greedy", "temperature", "combined", "top_k", "greedy", "top_p", "min_p",
             "temperature"]
    counts = [4, 4, 3, 4, 2, 1, 4, 3]
    b = make_batch(rs, [random_params(rs, k) for k in kinds], counts=counts)
    samples = row_samples(b)
    accept = [3, 0, 2, 1, 1, 0, 2, 0]  # drafts accepted per request (<= m - 1)
    drafts = []
    for s, m, a in zip(samples, counts, accept):
        d = rs.integers(0, V, size=m)
        d[:a] = s[:a]
        if a < m - 1:
            d[a] = (s[a] + 1 + rs.integers(0, V - 1)) % V  # a guaranteed mismatch
        drafts.append(d)
    b.draft_tokens = np.concatenate(drafts).astype(np.int32)
    out = check(b, M=M)
    np.testing.assert_array_equal(out.num_sampled.numpy(), np.array(accept) + 1)
    np.testing.assert_array_equal(out.num_rejected.numpy(), np.array(counts) - 1 - np.array(accept))
    for j, (s, a) in enumerate(zip(samples, accept)):
        np.testing.assert_array_equal(out.sampled_token_ids[j, :a + 1].numpy(), s[:a + 1])
        assert (out.sampled_token_ids[j, a + 1:] == -1).all()


def test_multi_row_requests_without_drafts_take_row_zero():
    rs = np.random.default_rng(8)
    b = make_batch(rs, [random_params(rs, k) for k in ("greedy", "combined", "temperature")],
                   counts=[3, 2, 1])
    out = check(b, M=3)
    np.testing.assert_array_equal(out.num_sampled.numpy(), [1, 1, 1])
    np.testing.assert_array_equal(out.num_rejected.numpy(), [2, 1, 0])
    samples = row_samples(b)
    np.testing.assert_array_equal(out.sampled_token_ids[:, 0].numpy(), [s[0] for s in samples])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_match_reference(dtype):
    rs = np.random.default_rng(9)
    K, M = 5, 3
    kinds = ["greedy", "temperature", "combined", "top_k", "greedy", "min_p"]
    nlp = [5, 1, 3, 0, 9, 5]  # 9 > K is clipped to K; 0 means none
    params = [random_params(rs, k, num_logprobs=n) for k, n in zip(kinds, nlp)]
    counts = [3, 2, 3, 1, 2, 3]
    b = make_batch(rs, params, counts=counts, dtype=dtype)
    samples = row_samples(b)
    accept = [2, 1, 0, 0, 0, 1]
    b.draft_tokens = drafts_accepting(samples, counts, accept)
    out = check(b, M=M, K=K)
    np.testing.assert_array_equal(out.num_sampled.numpy(), np.array(accept) + 1)
    # Empty entries past the slot's count, past num_sampled, and for slots without logprobs.
    assert (out.topk_ids[1, 0, 1:] == -1).all() and (out.topk_ids[1, 0, 0] >= 0)
    assert (out.topk_ids[3] == -1).all() and (out.sampled_rank[3] == 0).all()
    assert (out.topk_ids[2, 1:] == -1).all() and torch.isneginf(out.sampled_logprob[2, 1:]).all()
    assert (out.topk_ids[4, 0] >= 0).all()
    # The greedy token is the top-1 with rank 1.
    assert out.topk_ids[0, 0, 0] == out.sampled_token_ids[0, 0]
    assert (out.sampled_rank[0, :3] == 1).all()


def test_logprob_ties_rank_lower_ids_first():
    rs = np.random.default_rng(10)
    b = make_batch(rs, [SamplingParams(temperature=0.0, num_logprobs=4)])
    b.logits[0, :V] = -3.0
    b.logits[0, [150, 9, 77, 64]] = 2.0
    out = check(b, K=4)
    np.testing.assert_array_equal(out.topk_ids[0, 0].numpy(), [9, 64, 77, 150])
    assert out.sampled_token_ids[0, 0] == 9 and out.sampled_rank[0, 0] == 1


@pytest.mark.parametrize("pad_value", [float("inf"), float("nan"), 1.0e30])
def test_padding_columns_never_sampled_or_reported(pad_value):
    rs = np.random.default_rng(11)
    vocab, padded = 150, 187  # odd padded width; a strided view of a wider buffer
    kinds = ["greedy", "temperature", "combined", "top_k"]
    wide = make_logits(rs, len(kinds), vocab=vocab, padded=padded + 13, pad_value=pad_value)
    b = make_batch(rs, [random_params(rs, k, num_logprobs=3) for k in kinds])
    b.logits = wide[:, :padded]
    assert b.logits.stride(0) == padded + 13
    out = check(b, K=3, vocab_size=vocab)
    assert (out.sampled_token_ids[:, 0] < vocab).all()
    assert (out.topk_ids < vocab).all()
    assert (out.num_nans == 0).all()


def test_requests_past_n_untouched():
    rs = np.random.default_rng(12)
    params = [random_params(rs, k, num_logprobs=2) for k in ("greedy", "combined", "top_p",
                                                             "temperature", "min_p")]
    b = make_batch(rs, params, counts=[2, 1, 2, 1, 2])
    n = 3
    records, layout = run_kernel(b, M=2, K=2, n=n, max_num_reqs=7)
    assert (records[n:] == POISON).all()
    head = Batch(b.logits[:int(b.cu[n])], b.params[:n], b.counts[:n], b.seq_lens[:n], b.slots[:n])
    assert_same(records, layout, run_ref(head, M=2, K=2))


def test_zero_requests_write_nothing():
    rs = np.random.default_rng(13)
    b = make_batch(rs, [random_params(rs, "combined") for _ in range(4)])
    records, _ = run_kernel(b, K=2, n=0, max_num_reqs=4)
    assert (records == POISON).all()
    # A zero grid bound is a no-op as well.
    records, _ = run_kernel(b, n=0, max_num_reqs=0)
    assert (records == POISON).all()


def test_draws_independent_of_batch_placement():
    """Same (seed, position, token) -> same draw, whatever row, slot or batch holds the request."""
    rs = np.random.default_rng(14)
    kinds = ["temperature", "combined", "top_p", "min_p", "top_k", "greedy"]
    counts = [2, 3, 1, 3, 2, 1]
    b = make_batch(rs, [random_params(rs, k, num_logprobs=2) for k in kinds], counts=counts)
    samples = row_samples(b)
    b.draft_tokens = np.concatenate(samples).astype(np.int32)  # accept everything
    first, layout = run_kernel(b, M=3, K=2)
    perm = rs.permutation(len(kinds))
    cu = b.cu
    rows = np.concatenate([np.arange(cu[j], cu[j + 1]) for j in perm])
    other_slots = [int(s) for s in rs.choice(NUM_SLOTS, size=len(kinds), replace=False)]
    moved = Batch(b.logits[rows], [b.params[j] for j in perm], [counts[j] for j in perm],
                  [b.seq_lens[j] for j in perm], other_slots,
                  draft_tokens=b.draft_tokens[rows])
    second, _ = run_kernel(moved, M=3, K=2, max_num_reqs=len(kinds) + 3)
    np.testing.assert_array_equal(second[:len(kinds)].numpy(), first[perm].numpy())
    np.testing.assert_array_equal(unpack(first[:len(kinds)], layout).num_sampled.numpy(),
                                  np.array(counts))


def test_sampling_frequencies_follow_softmax():
    """Many positions of one tiny-vocab request: a chi-square test against softmax(logits / T)."""
    probs = np.array([0.05, 0.1, 0.15, 0.2, 0.22, 0.28])
    vocab, n, temp = len(probs), 400, 0.5
    logits = torch.tensor(np.log(probs) * temp, dtype=torch.float32)[None].repeat(n, 1)
    b = Batch(logits, [SamplingParams(temperature=temp, seed=12345)] * n, [1] * n,
              list(range(1000, 1000 + n)), [0] * n)
    records, layout = run_kernel(b, vocab_size=vocab, block_size=None, chunk_size=None)
    counts = np.bincount(unpack(records[:n], layout).sampled_token_ids[:, 0].numpy(),
                         minlength=vocab)
    chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum()
    assert chi2 < 20.5, (counts, chi2)  # df = 5, p = 0.001


def test_reference_frequencies_follow_filtered_softmax():
    """The reference's RNG and filters give the renormalised distribution (many positions)."""
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    n = 4000
    logits = np.tile(np.log(probs), (n, 1))
    p = SamplingParams(temperature=1.0, top_p=0.75, seed=99)
    ref = sample_ref(logits, vocab_size=6, req_slots=[0] * n, cu_num_logits=np.arange(n + 1),
                     seq_lens=np.arange(n), params=[p])
    counts = np.bincount(ref["tokens"][:, 0], minlength=6)
    assert counts[3:].sum() == 0  # 0.4 + 0.25 < 0.75 <= 0.8: three tokens kept
    want = probs[:3] / probs[:3].sum()
    chi2 = ((counts[:3] - n * want) ** 2 / (n * want)).sum()
    assert chi2 < 13.8, (counts, chi2)  # df = 2, p = 0.001


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 4), K=st.sampled_from([0, 2]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), with_mask=st.booleans(),
       tiling=st.sampled_from([(64, 64), (64, 128), (64, 256)]),
       group=st.sampled_from([None, 2, 3]))
def test_random_batches_match_reference(seed, n, K, dtype, with_mask, tiling, group):
    rs = np.random.default_rng(seed)
    kinds = ["greedy", "temperature", "top_k", "top_p", "min_p", "combined"]
    params = [random_params(rs, str(rs.choice(kinds)), num_logprobs=int(rs.integers(0, 3)))
              for _ in range(n)]
    counts = [int(c) for c in rs.integers(1, 3, size=n)]
    b = make_batch(rs, params, counts=counts, dtype=dtype)
    rows = sum(counts)
    b.draft_tokens = rs.integers(0, V, size=rows).astype(np.int32)
    if with_mask:
        b.bitmask = (rs.integers(0, 2**32, size=(rows, sampler.bitmask_words(V)), dtype=np.uint64)
                     .astype(np.uint32).view(np.int32))
        b.bitmask_rows = rs.permutation(rows).astype(np.int32)
    block, chunk = tiling
    check(b, M=2, K=K, max_num_reqs=n + int(rs.integers(0, 3)), block_size=block, chunk_size=chunk,
          splits_per_program=group)


@pytest.mark.parametrize("with_mask", [False, True])
def test_chunks_per_program_change_no_result(with_mask):
    """A scan program that streams several chunks stores each chunk's results as a program of
    its own would: every record word (tokens, logprob bits, ranks) and every partial result of
    the workspace is the same for 1, 2, 3 and all 4 chunks per program."""
    rs = np.random.default_rng(7)
    kinds = ["greedy", "temperature", "top_k", "top_p", "min_p", "combined"]
    params = [random_params(rs, kind, num_logprobs=3) for kind in kinds]
    b = make_batch(rs, params, counts=[2, 1, 2, 1, 2, 1])
    rows = sum(b.counts)
    b.draft_tokens = rs.integers(0, V, size=rows).astype(np.int32)
    if with_mask:
        b.bitmask = (rs.integers(0, 2**32, size=(rows, sampler.bitmask_words(V)), dtype=np.uint64)
                     .astype(np.uint32).view(np.int32))
        b.bitmask_rows = np.arange(rows, dtype=np.int32)
    results = []
    for group in (1, 2, 3, 4):
        ws = sampler.SamplerWorkspace.allocate(len(params), 2, V, DEVICE, chunk_size=CHUNK)
        records, layout = run_kernel(b, M=2, K=3, workspace=ws, splits_per_program=group)
        scan_fields = [f for f in range(NUM_PART.value) if f not in (P_FLOOR_S.value,
                                                                     P_FLOOR_R.value)]
        partials = ws.partials.view(-1, NUM_PART.value, ws.num_splits)[:, scan_fields].clone()
        results.append((records, partials))
    assert_same(results[0][0], layout, run_ref(b, M=2, K=3))
    for records, partials in results[1:]:
        assert torch.equal(records, results[0][0])
        assert torch.equal(partials, results[0][1])


def test_reference_reads_slot_tables_like_params():
    rs = np.random.default_rng(15)
    kinds = ["greedy", "combined", "top_p", "temperature"]
    b = make_batch(rs, [random_params(rs, k, num_logprobs=2) for k in kinds], counts=[1, 2, 1, 2])
    tables = SlotTables(NUM_SLOTS, "cpu")
    for slot, p in zip(b.slots, b.params):
        tables.set(slot, p)
    by_params = run_ref(b, M=2, K=2)
    by_tables = sample_ref(b.logits.numpy(), vocab_size=V, req_slots=b.slots, cu_num_logits=b.cu,
                           seq_lens=b.seq_lens, params=tables, K=2, max_num_logits_per_req=2)
    for name, want in by_params.items():
        np.testing.assert_array_equal(by_tables[name], want, err_msg=name)


# --------------------------------------------------------------------------- split-vocabulary pass

SV, SPV = 300, 320  # vocabulary of the split tests: chunks of 64 or 128 give 5 or 3 splits


def split_batch(rs, params, counts=None, dtype=torch.float32) -> Batch:
    counts = counts if counts is not None else [1] * len(params)
    b = make_batch(rs, params, counts=counts)
    b.logits = make_logits(rs, sum(counts), vocab=SV, padded=SPV, dtype=dtype)
    return b


@pytest.mark.parametrize("chunk", [64, 128])
def test_split_rows_combine_like_one_pass(chunk):
    """Ties across split and tile boundaries take the lowest id; rows without a finite score
    take token 0, whichever splits are empty; infinite scores tie in the Gumbel path too."""
    rs = np.random.default_rng(20)
    greedy = SamplingParams(temperature=0.0)
    params = [greedy] * 8 + [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3)]
    b = split_batch(rs, params)
    x = b.logits
    x[0, :SV] = -5.0
    x[0, [250, 130, 64, 63]] = 9.0  # 63 ends split 0, 64 starts split 1
    x[1, :SV] = -5.0
    x[1, [299, 255, 128]] = 9.0  # 128 starts split 2 (chunk 64) or split 1 (chunk 128)
    x[2, [200, 100]] = float("inf")
    x[3, :SV] = float("-inf")
    x[4, :SV] = float("nan")
    x[5, :SV] = float("-inf")
    x[5, 297] = -1.0e30  # the only finite logit, in the last (partial) split
    x[6, :SV] = -0.0
    x[6, 150] = 0.0  # +0 == -0: a tie, so token 0
    x[7, :SV] = 2.0
    x[7, 0] = float("nan")  # NaN at id 0 of an all-tie row
    x[8, [260, 70, 190]] = float("inf")  # s + g = inf three times: the lowest id
    x[9, :SV] = float("-inf")
    x[9, 296] = 3.0
    x[10, :SV] = float("-inf")
    records, layout = run_kernel(b, vocab_size=SV, block_size=32, chunk_size=chunk)
    out = assert_same(records, layout, run_ref(b, vocab_size=SV))
    np.testing.assert_array_equal(out.sampled_token_ids[:, 0].numpy(),
                                  [63, 128, 100, 0, 0, 297, 0, 1, 70, 296, 0])
    np.testing.assert_array_equal(out.num_nans.numpy(), [0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0])


def test_nan_in_one_split_counted_once():
    rs = np.random.default_rng(21)
    kinds = ["greedy", "temperature", "combined", "top_k", "greedy"]
    b = split_batch(rs, [random_params(rs, k) for k in kinds], counts=[2, 1, 1, 2, 1])
    b.logits[0, 270] = float("nan")  # last split only
    b.logits[1, [5, 6]] = float("nan")  # first split only, row 1 of request 0
    b.logits[2, 140] = float("nan")
    b.logits[3, 199] = float("nan")
    b.logits[4, SV + 5] = float("nan")  # padding: not counted
    b.logits[5, 64] = float("nan")  # request 3's second row: counted, not sampled
    b.logits[6, 64] = float("nan")
    b.logits[6, 63] = 50.0  # the max sits next to the NaN, across the split boundary
    records, layout = run_kernel(b, M=2, vocab_size=SV, block_size=32, chunk_size=64)
    out = assert_same(records, layout, run_ref(b, M=2, vocab_size=SV))
    np.testing.assert_array_equal(out.num_nans.numpy(), [2, 1, 1, 1, 1])
    assert out.sampled_token_ids[4, 0] == 63


def test_split_bitmask_drafts_and_logprobs():
    """Bitmask rows, drafts and logprobs rows mixed with greedy rows, over three splits."""
    rs = np.random.default_rng(22)
    M, K = 3, 3
    kinds = ["greedy", "temperature", "combined", "greedy", "top_p", "temperature", "min_p"]
    nlp = [0, 2, 3, 3, 0, 0, 1]
    counts = [3, 3, 2, 1, 3, 2, 3]
    b = split_batch(rs, [random_params(rs, k, num_logprobs=n) for k, n in zip(kinds, nlp)],
                    counts=counts, dtype=torch.bfloat16)
    rows = sum(counts)
    mask = (rs.integers(0, 2**32, size=(rows, sampler.bitmask_words(SV)), dtype=np.uint64)
            .astype(np.uint32).view(np.int32))
    set_allowed(mask[0], [290])  # only in the last split
    set_allowed(mask[3], [290])
    set_allowed(mask[4], [])  # nothing allowed: token 0
    set_allowed(mask[9], [127, 128])
    b.bitmask, b.bitmask_rows = mask, rs.permutation(rows).astype(np.int32)
    b.bitmask_rows[:3] = [0, 3, 4]
    b.bitmask_rows[9] = 9
    samples = row_samples(b, vocab_size=SV)
    accept = [2, 1, 1, 0, 0, 1, 1]
    b.draft_tokens = drafts_accepting(samples, counts, accept, vocab=SV)
    records, layout = run_kernel(b, M=M, K=K, vocab_size=SV, block_size=32, chunk_size=128)
    out = assert_same(records, layout, run_ref(b, M=M, K=K, vocab_size=SV))
    np.testing.assert_array_equal(out.num_sampled.numpy(), np.array(accept) + 1)
    np.testing.assert_array_equal(out.sampled_token_ids[0].numpy(), [290, 290, 0])


def test_workspace_reused_across_batch_sizes_and_stale_contents():
    """One preallocated workspace serves every grid bound; whatever it held before is never read
    (but the pool fills, which every launch leaves at zero)."""
    rs = np.random.default_rng(23)
    kinds = ["greedy", "combined", "temperature", "top_k", "greedy", "min_p"]
    b = split_batch(rs, [random_params(rs, k) for k in kinds], counts=[2, 1, 2, 1, 2, 1])
    ws = sampler.SamplerWorkspace.allocate(8, 2, SV, DEVICE, chunk_size=64)
    assert (ws.max_num_reqs, ws.max_num_logits_per_req, ws.num_splits) == (8, 2, 5)
    want = run_ref(b, M=2, vocab_size=SV)
    for n, bound in [(6, 8), (3, 4)]:
        for section in (ws.partials, ws.pool):
            section.random_(-2**31, 2**31 - 1)
        head = Batch(b.logits[:int(b.cu[n])], b.params[:n], b.counts[:n], b.seq_lens[:n],
                     b.slots[:n])
        records, layout = run_kernel(head, M=2, vocab_size=SV, max_num_reqs=bound,
                                     block_size=32, workspace=ws)
        assert_same(records, layout, {k: v[:n] for k, v in want.items()})
        assert (ws.arrivals == 0).all()  # the pool words: `run_kernel` checks them


def test_default_chunks_depend_on_the_vocabulary_only():
    ws = sampler.SamplerWorkspace.allocate(4, 2, 152064, "cpu")
    assert (ws.chunk_size, ws.num_splits) == (8192, 19)
    assert ws.pool_size == 8192  # 19 chunks of up to 384 candidates
    ws = sampler.SamplerWorkspace.allocate(1, 1, V, "cpu")
    # A launch captures a token at most once: the pool is capped at the (padded) vocabulary.
    assert (ws.chunk_size, ws.num_splits, ws.pool_size) == (256, 1, 256)
    assert ws.partials.numel() == NUM_PART.value * 1
    for bad in (48, 8, 0):
        with pytest.raises(ValueError, match="chunk_size"):
            sampler.SamplerWorkspace.allocate(1, 1, V, "cpu", chunk_size=bad)
        with pytest.raises(ValueError, match="pool_size"):
            sampler.SamplerWorkspace.allocate(1, 1, V, "cpu", pool_size=bad)
    with pytest.raises(ValueError, match="max_num_reqs"):
        sampler.SamplerWorkspace.allocate(-1, 1, V, "cpu")


# --------------------------------------------------------------------------- launcher contract


def test_one_compiled_kernel_pair_serves_every_batch_size(monkeypatch):
    """Specialization key of each kernel's launch is the same for every n and every grid bound
    (the scan's for every grid bound with the same number of chunks per program, the finish's
    below FINISH_CAPPED_ROWS)."""
    keys, grids = {}, {}

    def record_launch(kernel, grid, *args, **kwargs):
        keys.setdefault(kernel, []).append(specialization_key(kernel, args, kwargs))
        grids.setdefault(kernel, []).append(grid)

    monkeypatch.setattr(sampler, "launch", record_launch)
    rows_max, max_reqs = 16, 16
    logits = torch.zeros(rows_max, PV)
    records = torch.zeros(max_reqs, RecordLayout(2, 3).width, dtype=torch.int32)
    tables = SlotTables(NUM_SLOTS, "cpu")
    ws = sampler.SamplerWorkspace.allocate(max_reqs, 2, V, "cpu", chunk_size=CHUNK)
    bounds, groups = [1, 4, 8, 16, 4, 16], [None, None, None, None, 2, 2]
    for n, bound, group in zip([1, 3, 5, 16, 2, 9], bounds, groups):
        sampler.sample(logits, vocab_size=V, num_reqs=i32([n], "cpu"),
                       req_slots=i32(np.zeros(max_reqs), "cpu"),
                       cu_num_logits=i32(np.arange(max_reqs + 1), "cpu"),
                       seq_lens=i32(np.zeros(max_reqs), "cpu"), tables=tables,
                       layout=RecordLayout(2, 3), records=records, max_num_reqs=bound,
                       draft_tokens=i32(np.zeros(rows_max), "cpu"), workspace=ws,
                       splits_per_program=group)
    assert set(keys) == {sampler._scan_kernel, sampler._finish_kernel}
    # One finish, and one scan per number of chunks a scan program streams.
    assert len(set(keys[sampler._finish_kernel])) == 1
    scans = keys[sampler._scan_kernel]
    assert len(set(scans[:4])) == 1 and len(set(scans[4:])) == 1 and scans[0] != scans[4]
    assert grids[sampler._scan_kernel] == [(2, 4), (8, 4), (16, 4), (32, 4), (8, 2), (32, 2)]
    # Two programs per row and more only at small batch (FINISH_PROGRAMS): all of these.
    assert grids[sampler._finish_kernel] == [(2 * b, 16) for b in bounds]


def test_bitmask_row_stride_does_not_specialise(monkeypatch):
    """The engine's bitmask rows are as wide as the padded vocabulary, the oracle's perhaps as
    wide as the real one: both launch the same compiled kernels."""
    keys = {}

    def record_launch(kernel, grid, *args, **kwargs):
        keys.setdefault(kernel, set()).add(specialization_key(kernel, args, kwargs))

    monkeypatch.setattr(sampler, "launch", record_launch)
    rows, layout = 4, RecordLayout(1, 0)
    words = sampler.bitmask_words(V)
    for width in (words, words + 5, 16 * words):
        sampler.sample(torch.zeros(rows, PV), vocab_size=V, num_reqs=i32([2], "cpu"),
                       req_slots=i32(np.zeros(rows), "cpu"),
                       cu_num_logits=i32(np.arange(rows + 1), "cpu"),
                       seq_lens=i32(np.zeros(rows), "cpu"), tables=SlotTables(NUM_SLOTS, "cpu"),
                       layout=layout, records=torch.zeros(rows, layout.width, dtype=torch.int32),
                       max_num_reqs=rows, bitmask=i32(np.zeros((rows, width)), "cpu"),
                       bitmask_rows=i32(np.arange(rows), "cpu"), bitmask_enabled=i32([1], "cpu"))
    # The scan's two variants (with and without bitmask support) and one finish.
    assert {kernel: len(ks) for kernel, ks in keys.items()} == {sampler._scan_kernel: 2,
                                                                sampler._finish_kernel: 1}


def _valid_args(**over):
    layout = RecordLayout(1, 0)
    args = dict(vocab_size=V, num_reqs=i32([1], "cpu"), req_slots=i32([0, 0], "cpu"),
                cu_num_logits=i32([0, 1, 2], "cpu"), seq_lens=i32([0, 0], "cpu"),
                tables=SlotTables(4, "cpu"), layout=layout,
                records=torch.zeros(2, layout.width, dtype=torch.int32), max_num_reqs=2)
    args.update(over)
    return args


@pytest.mark.parametrize("logits, over, exc, match", [
    (torch.zeros(2, PV, dtype=torch.int32), {}, TypeError, "logits must be float32"),
    (torch.zeros(2, PV).t(), {}, ValueError, "contiguous last dim"),
    (torch.zeros(2, PV), {"vocab_size": PV + 1}, ValueError, "vocab_size"),
    (torch.zeros(2, PV), {"req_slots": torch.zeros(2, dtype=torch.int64)}, TypeError,
     "req_slots must be int32"),
    (torch.zeros(2, PV), {"cu_num_logits": i32([0, 1], "cpu")}, ValueError,
     "cu_num_logits must be a contiguous 1-D tensor of at least 3"),
    (torch.zeros(2, PV), {"records": torch.zeros(2, 99, dtype=torch.int32)}, ValueError,
     "records must be"),
    (torch.zeros(2, PV), {"records": torch.zeros(2, 4)}, TypeError, "records must be an int32"),
    (torch.zeros(2, PV), {"bitmask": i32(np.zeros((2, 7)), "cpu")}, ValueError,
     "bitmask and bitmask_rows"),
    (torch.zeros(2, PV), {"bitmask": i32(np.zeros((2, 3)), "cpu"),
                          "bitmask_rows": i32([0, 0], "cpu")}, ValueError, "bitmask must be"),
    (torch.zeros(2, PV), {"draft_tokens": i32([0], "cpu")}, ValueError, "draft_tokens must be a contiguous 1-D tensor of at least"),
    (torch.zeros(2, PV), {"tables": object()}, TypeError, "SlotTables"),
    (torch.zeros(2, PV), {"block_size": 48}, ValueError, "power of two"),
    (torch.zeros(2, PV), {"max_num_reqs": -1}, ValueError, "max_num_reqs"),
    (torch.zeros(2, PV), {"workspace": object()}, TypeError, "SamplerWorkspace"),
    (torch.zeros(2, PV), {"workspace": sampler.SamplerWorkspace.allocate(2, 1, V + 1, "cpu")},
     ValueError, "vocab_size"),
    (torch.zeros(2, PV), {"workspace": sampler.SamplerWorkspace.allocate(2, 2, V, "cpu")},
     ValueError, "logits rows per request"),
    (torch.zeros(2, PV), {"workspace": sampler.SamplerWorkspace.allocate(1, 1, V, "cpu")},
     ValueError, "workspace holds 1 requests"),
])
def test_launcher_rejects_bad_inputs(logits, over, exc, match):
    with pytest.raises(exc, match=match):
        sampler.sample(logits, **_valid_args(**over))


# --------------------------------------------------------------------------- adversarial rows
# A vocabulary of several 512-column chunks folded into 128 lanes each, so capture floors sit
# inside every chunk as they do at full size; a small pool forces the verify and whole-row paths.

AV, APV, A_CHUNK, A_BLOCK = 2000, 2048, 512, 128
ROW_KINDS = ("flat", "peaked", "equal", "ties_at_threshold", "single_finite", "nan_row",
             "some_nan", "one_allowed", "two_allowed", "all_neg_inf")


def adversarial_row(rs, kind: str, vocab=AV, padded=APV):
    """(logits [padded] fp32, allowed token ids or None for no bitmask)."""
    x = (rs.standard_normal(padded) * 3).astype(np.float32)
    x[vocab:] = 1.0e4  # padding: never sampled
    allowed = None
    if kind == "peaked":
        x[rs.integers(0, vocab)] += 20.0
    elif kind == "equal":
        x[:vocab] = np.float32(rs.normal())
    elif kind == "ties_at_threshold":
        # 40 distinct large values, then over a thousand exact ties, everything else far below:
        # top-k 50 and most top-p thresholds land on the tie.
        tie = np.float32(2.0)
        x[:vocab] = tie - 8.0 - rs.random(vocab).astype(np.float32)
        ids = rs.permutation(vocab)
        x[ids[:40]] = tie + 1.0 + rs.random(40).astype(np.float32)
        x[ids[40:40 + int(rs.integers(1000, vocab - 100))]] = tie
    elif kind == "single_finite":
        x[:vocab] = -np.inf
        x[rs.integers(0, vocab)] = np.float32(rs.normal())
    elif kind == "nan_row":
        x[:vocab] = np.nan
    elif kind == "some_nan":
        x[rs.choice(vocab, 5, replace=False)] = np.nan
    elif kind == "one_allowed":
        allowed = [int(rs.integers(0, vocab))]
    elif kind == "two_allowed":
        allowed = [int(t) for t in rs.choice(vocab, 2, replace=False)]
    elif kind == "all_neg_inf":
        x[:vocab] = -np.inf
    return x, allowed


def adversarial_params(rs, vocab=AV) -> SamplingParams:
    temperature = float(rs.choice([0.0, 1e-30, 0.3, 0.8, 1.0, 7.0, 1e30]))
    return SamplingParams(
        temperature=temperature,
        top_k=int(rs.choice([0, 1, 2, 50, 128, 300, vocab - 1, vocab, vocab + 5])),
        top_p=float(rs.choice([1e-6, 0.3, 0.9, 1 - 1e-6, 1.0])),
        min_p=float(rs.choice([0.0, 0.0, 0.05, 1.0])),
        seed=int(rs.integers(0, 2**63)), num_logprobs=int(rs.choice([0, 1, 3])))


def adversarial_batch(rs, kinds, vocab=AV, padded=APV) -> Batch:
    rows = [adversarial_row(rs, k, vocab, padded) for k in kinds]
    b = make_batch(rs, [adversarial_params(rs, vocab) for _ in kinds])
    b.logits = torch.from_numpy(np.stack([r for r, _ in rows]))
    if any(a is not None for _, a in rows):
        b.bitmask = full_bitmask(len(kinds), vocab)
        for i, (_, a) in enumerate(rows):
            if a is not None:
                set_allowed(b.bitmask[i], a)
        b.bitmask_rows = np.arange(len(kinds), dtype=np.int32)
    return b


def run_adversarial(b: Batch, pool_size=None, vocab=AV, chunk=A_CHUNK, block=A_BLOCK,
                    finish_programs=None, split_draws=None, raced_draws=None):
    """Sample `b` and check it against the reference -> the workspace's slow-path counts.
    `split_draws`, `raced_draws`: lists the count of rows drawn by the split nucleus draw, and
    by the one-program top-p search's race, are appended to."""
    ws = sampler.SamplerWorkspace.allocate(len(b.params), 1, vocab, DEVICE, chunk_size=chunk,
                                           pool_size=pool_size)
    records, layout = run_kernel(b, K=3, vocab_size=vocab, block_size=block, workspace=ws,
                                 finish_programs=finish_programs)
    assert_same(records, layout, run_ref(b, K=3, vocab_size=vocab))
    if split_draws is not None:
        split_draws.append(ws.split_draws())
    if raced_draws is not None:
        raced_draws.append(ws.pool_draws_raced())
    return ws.paths()


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_adversarial_rows_match_reference(kind):
    rs = np.random.default_rng(sum(map(ord, kind)))
    for pool_size in (None, 16):
        run_adversarial(adversarial_batch(rs, [kind] * 4), pool_size=pool_size)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), small_pool=st.booleans(),
       finish_programs=st.sampled_from([1, 2, 16]))
def test_adversarial_batches_match_reference(seed, small_pool, finish_programs):
    rs = np.random.default_rng(seed)
    kinds = [str(k) for k in rs.choice(ROW_KINDS, size=3)]
    run_adversarial(adversarial_batch(rs, kinds), pool_size=16 if small_pool else None,
                    finish_programs=finish_programs)


def min_p_batch(rs, kind: str, vocab=AV, padded=APV) -> Batch:
    """Four rows of one adversarial kind with min-p alone: temperatures from 1e-30 to 1e30
    (scores that overflow or underflow) and min-p from 1e-6 to 1, in random pairs."""
    b = adversarial_batch(rs, [kind] * 4, vocab, padded)
    b.params = [SamplingParams(temperature=t, min_p=p, seed=int(rs.integers(0, 2**63)))
                for t, p in zip(rs.permutation([1e-30, 0.3, 7.0, 1e30]),
                                rs.permutation([1e-6, 0.05, 0.5, 1.0]))]
    return b


@pytest.mark.parametrize("kind", ROW_KINDS)
def test_min_p_rows_match_reference(kind):
    """Min-p-only rows capture above the row maximum published so far, with no floor search:
    every row kind, with the default pool and with one too small for the kept set."""
    rs = np.random.default_rng(sum(map(ord, kind)) + 1)
    for pool_size in (None, 16):
        run_adversarial(min_p_batch(rs, kind), pool_size=pool_size)


def test_every_path_settles_rows_exactly():
    """Rows settled from the pool, by verifying the unfiltered winner, and by the whole-row
    fallback all equal the reference; the counters show each path ran."""
    rs = np.random.default_rng(30)
    # Candidates: top-k 50 + top-p over flat rows.
    b = adversarial_batch(rs, ["flat"] * 4)
    b.params = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=i, num_logprobs=3)
                for i in range(4)]
    assert run_adversarial(b) == NO_SLOW_PATHS
    # Candidates: min-p alone, cut at the row maximum.
    b = adversarial_batch(rs, ["flat"] * 4)
    b.params = [SamplingParams(temperature=0.8, min_p=0.05, seed=i) for i in range(4)]
    assert run_adversarial(b) == NO_SLOW_PATHS
    # Verify: a pool too small for the nucleus of top-p 0.999 over flat rows, temperature 2.
    b = adversarial_batch(rs, ["flat"] * 4)
    b.params = [SamplingParams(temperature=2.0, top_p=0.999, seed=i) for i in range(4)]
    assert run_adversarial(b, pool_size=16)["counted"] > 0
    # Whole-row fallback: top-k 50 on exact ties overflowing a small pool.
    b = adversarial_batch(rs, ["ties_at_threshold"] * 4)
    b.params = [SamplingParams(temperature=1.0, top_k=50, seed=i, num_logprobs=2)
                for i in range(4)]
    paths = run_adversarial(b, pool_size=16)
    assert paths["draw_fallback"] == 4 and paths["logprobs_fallback"] == 4


@pytest.mark.parametrize("programs", [1, 16])
@pytest.mark.parametrize("chunk", [2048, 4096])
def test_pools_past_one_sort_tile_settle_from_candidates(chunk, programs):
    """Pools larger than a sort tile with room behind them, alone and after a top-k above the
    pool's small bound, equal the reference with no row off the candidate path. With 2048-column
    chunks these rows pool 2102-2185 entries of 4096: the top-p threshold comes from the pivot
    pass and the sorted interval (`candidates.search_mass`). With 4096-column chunks they pool
    1038-1192 entries of 2048: one sort of two tiles (`resolve.draw_from_pool`). (Pool sizes read
    on CPU with the finish instrumented.) That is with one finish program per row; with 16 (the
    default at small batch) the three top-p rows without top-k are drawn by their slices'
    programs instead (`graphshard.sample.nucleus`), 9 to 17 slices of 128 or 256."""
    rs = np.random.default_rng(31)
    vocab, padded = 16000, 16384
    b = adversarial_batch(rs, ["flat"] * 4, vocab, padded)
    b.params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1),
                SamplingParams(temperature=0.8, top_p=0.5, seed=2, num_logprobs=2),
                SamplingParams(temperature=1.3, top_k=400, top_p=0.8, seed=3),
                SamplingParams(temperature=0.5, top_p=0.95, seed=4)]
    split, raced = [], []
    paths = run_adversarial(b, vocab=vocab, chunk=chunk, block=1024, finish_programs=programs,
                            split_draws=split, raced_draws=raced)
    assert paths == NO_SLOW_PATHS
    # With several programs per row, the three top-p rows without top-k are split.
    assert split == [3 if programs > 1 else 0]
    # Flat rows: no interval's best score beats the rest, so no draw is raced.
    assert raced == [0]


@pytest.mark.parametrize("top_k", [5, 20, 256])
def test_hot_lanes_of_every_listing_tile_are_captured(top_k):
    """The capture lists a program's hot lanes and reads them in a tile sized to their number
    (`floors.capture_hot`). Here a lane's values rise with its index, so the lanes listed last
    hold the row's largest logits, which every answer below needs: the top-k, top-p and the
    top-K logprobs, all from the pool. A top-k of 5 leaves ~20 lanes hot (its floor is searched
    over maxima of four adjacent lanes), 20 leaves ~80 (the middle tile), 256 a few more than
    256 (its rounding: the second, narrower tile after the widest). (A lane's second column lies
    far below its first, so a chunk captures one token per hot lane and the pool holds them
    all.)"""
    rs = np.random.default_rng(32)
    vocab, chunk, block = 4096, 2048, 1024
    col = np.arange(vocab)
    base = (col % block) * 0.01 - (col % chunk >= block) * 20.0
    rows = [base + rs.standard_normal(vocab) * 1e-3 for _ in range(4)]
    b = make_batch(rs, [SamplingParams(temperature=1.0, top_k=top_k, seed=1, num_logprobs=3),
                        SamplingParams(temperature=0.05, top_p=0.9, seed=2),
                        SamplingParams(temperature=0.7, top_k=min(top_k, 200), top_p=0.5,
                                       seed=3, num_logprobs=2),
                        SamplingParams(temperature=0.0, num_logprobs=3)])
    b.logits = torch.from_numpy(np.stack(rows).astype(np.float32))
    paths = run_adversarial(b, vocab=vocab, chunk=chunk, block=block)
    assert paths == NO_SLOW_PATHS


@pytest.mark.parametrize("block, dtype", [(32, torch.float32), (128, torch.float32),
                                          (32, torch.bfloat16)])
def test_logprob_passes_read_chunks_with_nans_again(block, dtype):
    # A logprob row's pass (`rows.sum_chunk`: greedy rows, and top-k rows without top-p) folds
    # a chunk in steps of tiles (four steps of four tiles per 512-column chunk at block 32, one
    # at 128), leaves NaNs in on its first try and reads a chunk again when one reached its
    # sums. NaN counts, tokens (ties to the lowest id) and logprobs match the reference for a
    # few NaNs, an all-NaN row, rows without a finite logit, equal rows and ties, and streaming
    # one or two chunks per program gives the same records; with 16-bit logits too.
    rs = np.random.default_rng(7)
    kinds = ("some_nan", "nan_row", "all_neg_inf", "single_finite", "peaked", "equal",
             "ties_at_threshold")
    rows, params = [], []
    for kind in kinds:
        rows += [adversarial_row(rs, kind)[0] for _ in range(2)]
        params += [SamplingParams(temperature=0.0, num_logprobs=3),
                   SamplingParams(temperature=0.8, top_k=50, seed=int(rs.integers(0, 2**63)),
                                  num_logprobs=3)]
    b = make_batch(rs, params)
    b.logits = torch.from_numpy(np.stack(rows)).to(dtype)
    runs = [run_kernel(b, K=3, vocab_size=AV, block_size=block, chunk_size=A_CHUNK,
                       splits_per_program=group)[0] for group in (1, 2)]
    assert torch.equal(runs[0], runs[1])
    assert_same(runs[0], RecordLayout(1, 3), run_ref(b, K=3, vocab_size=AV))


def test_rows_of_few_chunks_capture_more_and_settle_from_their_pools():
    """A row of 4 chunks captures SMALL_ROW_CHUNK_TOP candidates per chunk (192 of 512 here,
    with 256 floor lanes): a near-flat top-p row whose nucleus holds ~150 tokens of every chunk
    settles from its pool (128 per chunk would leave part of it out), and every row equals the
    reference."""
    vocab, padded, chunk = 2000, 2048, 512
    assert -(-vocab // chunk) <= SMALL_ROW_SPLITS and SMALL_ROW_CHUNK_TOP > 150
    rs = np.random.default_rng(31)
    params = [SamplingParams(temperature=1.0, top_p=0.3, seed=s) for s in range(4)]
    params += [SamplingParams(temperature=0.8, top_p=0.9, seed=7),
               SamplingParams(temperature=0.8, min_p=0.05, seed=8),
               SamplingParams(temperature=0.8, seed=9, num_logprobs=3)]
    b = make_batch(rs, params)
    b.logits = make_logits(rs, len(params), vocab=vocab, padded=padded) * 3
    b.logits[:4, :vocab] = torch.from_numpy(rs.uniform(0.0, 0.01, (4, vocab)).astype(np.float32))
    ws = sampler.SamplerWorkspace.allocate(len(params), 1, vocab, DEVICE, chunk_size=chunk)
    records, layout = run_kernel(b, K=3, vocab_size=vocab, block_size=256, workspace=ws)
    assert_same(records, layout, run_ref(b, K=3, vocab_size=vocab))
    assert ws.paths() == NO_SLOW_PATHS
