"""The default divergence check on CPU (gloo, and p2p kernels under the interpreter): every kind of
rank divergence raises the same `RankDivergenceError` on every rank, no step that passes
returns a wrong token, and the engine goes on once the ranks agree again."""

import os

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine.divergence import DivergenceCheck
from graphshard.transports.digest import DIGEST_INT32, inputs_digest_np
from graphshard.plan.staging import Staging
from graphshard.engine import Engine
from graphshard.errors import InvalidBatchError, RankDivergenceError
from graphshard.sample.params import SamplingParams

CFG = Config(vocab_size=40, vocab_pad_multiple=8, max_num_reqs=4, max_num_logits_per_req=2,
             max_num_slots=6, buckets=(2, 4), graph_backend="emulated", timeout_s=30.0)


def _batch(rng: np.random.Generator, vocab: int, n: int = 2):
    """Replicated inputs (the same draws on every rank) and full-vocabulary logits with one clear
    winner per row, so greedy rows have one right token."""
    idx = np.arange(n, dtype=np.int32)
    cu = np.arange(n + 1, dtype=np.int32)
    lens = rng.integers(1, 30, n).astype(np.int32)
    full = torch.from_numpy(rng.standard_normal((n, vocab)).astype(np.float32))
    winners = rng.integers(0, CFG.vocab_size, n)
    full[np.arange(n), winners] = 50.0
    return idx, cu, lens, full, winners


def diverging_run(rank, world, cfg):
    """Each kind of divergence on rank 1, agreeing steps in between: what every step gave
    (also run on GPUs by tests/gpu/test_divergence_gpu.py)."""
    engine = Engine(cfg)
    engine.capture()
    for slot in range(4):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    rng = np.random.default_rng(3)
    lo, hi = engine.shard_columns()
    results = []

    def attempt(kind, idx, cu, lens, full, winners, bad_rank=1):
        shard = full[:, lo:hi].contiguous().to(engine.device)
        try:
            out = engine.step(idx, cu, lens, shard)
            tokens = out.sampled_token_ids[:, 0].tolist()
            engine.raise_if_failed()
        except InvalidBatchError as e:
            results.append((kind, type(e).__name__, str(e)))
            return
        # A step that passed: its tokens must be right.
        results.append((kind, "ok", tokens == winners.tolist()))

    def agreeing(kind="agree"):
        attempt(kind, *_batch(rng, engine.vocab))

    agreeing()
    idx, cu, lens, full, win = _batch(rng, engine.vocab)
    attempt("slots", idx + 2 * (rank == 1), cu, lens, full, win)  # rank 1 names other slots
    agreeing()
    idx, cu, lens, full, win = _batch(rng, engine.vocab)
    two_rows = np.array([0, 2, 3] if rank == 1 else [0, 1, 3], np.int32)  # same rows in total
    attempt("cu_num_logits", idx, two_rows, lens, torch.cat([full, full[:1]]), win)
    idx, cu, lens, full, win = _batch(rng, engine.vocab)
    attempt("seq_lens", idx, cu, lens + (rank == 1), full, win)
    agreeing()
    engine.add_request(4, SamplingParams(temperature=0.7 if rank == 1 else 0.0))
    idx, cu, lens, full, win = _batch(rng, engine.vocab)
    attempt("params", np.array([4, 1], np.int32), cu, lens, full, win)
    engine.add_request(4, SamplingParams(temperature=0.0), replace=True)  # they agree again
    if rank == 0:
        engine.add_request(5, SamplingParams(temperature=0.0))  # rank 1 misses this one
    idx, cu, lens, full, win = _batch(rng, engine.vocab)
    attempt("missed_add_request", np.array([5, 1], np.int32), cu, lens, full, win)
    if rank == 0:
        engine.remove_request(5)
    agreeing()
    # Every rank refuses the same way: the refusal itself, on every rank.
    attempt("refused_everywhere", np.array([5, 1], np.int32), cu, lens, full, win)
    if rank == 1:
        engine.steps += 1  # as if this rank had issued one more step than its peers
    agreeing("skipped_step")
    engine.close()
    return results


def check_outcomes(r0, r1):
    """Every rank saw the same; every divergence raised naming what differed; no wrong token."""
    assert r0 == r1, (r0, r1)  # the same outcome and the same message on both ranks
    got = {kind: (outcome, detail) for kind, outcome, detail in r0 if kind != "agree"}
    for kind, outcome, detail in r0:
        if outcome == "ok":
            assert detail is True, f"{kind}: a step that passed returned a wrong token"
    assert all(o == "ok" for k, o, _ in r0 if k == "agree")  # usable again once ranks agree
    what = {"slots": "replicated step inputs", "cu_num_logits": "replicated step inputs",
            "seq_lens": "replicated step inputs",
            "params": "active requests and their sampling parameters",
            "missed_add_request": "ranks [1] refused the batch",
            "skipped_step": "step counts"}
    for kind, phrase in what.items():
        outcome, message = got[kind]
        assert outcome == "RankDivergenceError", (kind, got[kind])
        assert phrase in message and "ranks [1]" in message, (kind, message)
    assert got["refused_everywhere"] == ("InvalidBatchError",
                                         "slot 5 holds no request; call add_request first")


@pytest.mark.parametrize("strategy", ["shard", "replicate"])
@pytest.mark.parametrize("transport", ["gloo", "p2p"])
def test_every_divergence_raises_on_every_rank_and_no_wrong_token_passes(transport, strategy):
    """Shard steps judge the digests their record gather (gloo) or row push (p2p) carried;
    replicate steps, which gather no records, in their closing exchange."""
    if transport == "p2p" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("p2p kernels on CPU run under TRITON_INTERPRET=1")
    cfg = CFG.replace(transport=transport, strategy=strategy)
    check_outcomes(*spawn(diverging_run, 2, cfg, timeout_s=300))


def sealed_inputs_word(idx, cu, lens, flags: int = 0, device=torch.device("cpu")) -> int:
    """The inputs word of the digest the device seals after fetching this batch (staged as step
    3, host flags `flags`)."""
    staging = Staging(max_num_reqs=8, device=device)
    check = DivergenceCheck(0, 2, device, staging)
    check.seal(3, slots=77, flags=flags)
    staging.write(3, idx, cu, lens, False)
    staging.fetch()
    out = torch.zeros(DIGEST_INT32, dtype=torch.int32, device=device)
    check.seal_on_device(out)
    words = out.view(torch.int64).tolist()
    assert words[0] == 3 and words[2] == 77 and words[3] == 0  # step, slots, spare
    return words[1]


def test_the_device_digest_equals_its_reference_and_sees_every_replicated_word(device="cpu"):
    """Also run on a GPU by tests/gpu/test_kernels_gpu.py."""
    device = torch.device(device)
    rng = np.random.default_rng(5)
    seen = set()
    for n in (0, 1, 3, 8):
        idx = rng.permutation(8)[:n].astype(np.int32)
        cu = np.concatenate([[0], np.cumsum(rng.integers(1, 5, n))]).astype(np.int32)
        lens = rng.integers(0, 2**31 - 1, n).astype(np.int32)
        base = sealed_inputs_word(idx, cu, lens, device=device)
        assert base == inputs_digest_np(idx, cu, lens), n
        seen.add(base)
        # Any one word changed, anywhere in the three arrays, changes the digest.
        words = np.concatenate([idx, cu, lens])
        for i in range(words.size):
            changed = words.copy()
            changed[i] ^= 1 << int(rng.integers(0, 31))
            a, c, l = np.split(changed, [n, 2 * n + 1])
            assert inputs_digest_np(a, c, l) != base, (n, i)
    assert len(seen) == 4  # batch sizes differ too
    # Two rows swapped: the same words in another order.
    idx, cu, lens = np.array([1, 2], np.int32), np.arange(3, dtype=np.int32), np.array([7, 9], np.int32)
    assert inputs_digest_np(idx[::-1], cu, lens) != inputs_digest_np(idx, cu, lens)
    # The host's flags ride above the 32-bit hash.
    flags = DivergenceCheck.flags(True, False, refused=True)
    assert sealed_inputs_word(idx, cu, lens, flags, device) == inputs_digest_np(idx, cu, lens) | flags
    assert DivergenceCheck.flags(True, False) != DivergenceCheck.flags(False, False)


def test_the_judge_that_ends_a_step_writes_the_verdict_before_the_done_word(device="cpu"):
    """The padded transports' judge kernel with `done`: rank 1's gathered digest differs in its
    inputs, so step 3's verdict row names it, and the step's done word says 3. Also run on a GPU
    by tests/gpu/test_kernels_gpu.py."""
    device = torch.device(device)
    staging = Staging(max_num_reqs=8, device=device)
    check = DivergenceCheck(0, 2, device, staging)
    check.seal(3, slots=77, flags=0)
    idx, cu, lens = np.array([4, 1], np.int32), np.arange(3, dtype=np.int32), np.array([5, 6], np.int32)
    staging.write(3, idx, cu, lens, False)
    staging.fetch()
    gathered = torch.zeros(2 * DIGEST_INT32, dtype=torch.int32, device=device)
    check.seal_on_device(gathered[:DIGEST_INT32])
    check.seal_on_device(gathered[DIGEST_INT32:])
    gathered[DIGEST_INT32 + 2] += 1  # rank 1's inputs word
    check.judge_gathered(gathered, DIGEST_INT32, done=staging)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    assert staging.finished() == 3
    with pytest.raises(RankDivergenceError, match=r"step 3 .*ranks \[1\] differ from rank 0 in "
                                                  r"their replicated step inputs"):
        check.check(3)


def test_the_check_is_on_by_default_and_a_preset_can_turn_it_off(tmp_path):
    assert Config(vocab_size=10, max_num_reqs=2).divergence_check is True
    preset = tmp_path / "off.toml"
    preset.write_text("[engine]\nvocab_size = 10\nmax_num_reqs = 2\ndivergence_check = false\n")
    assert Config.from_toml(preset).divergence_check is False
    with pytest.raises(ValueError, match="divergence_check"):
        Config(vocab_size=10, max_num_reqs=2, divergence_check=1)
