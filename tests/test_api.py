"""The user's side of the engine: the top-level API, CPU set-up, request and capture mistakes,
the step's host copy, and the engine's life cycle."""

import os
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import graphshard
from graphshard import (BatchTooLargeError, Config, ConfigError, Engine, EngineStateError,
                        InvalidBatchError, InvalidParamsError, InvalidSlotError, InvalidTypeError,
                        RankDivergenceError, SamplingParams, StepFault)
from graphshard.harness.distributed import spawn

ROOT = Path(__file__).resolve().parents[1]
CFG = Config(vocab_size=90, vocab_pad_multiple=8, max_num_reqs=4, max_num_logits_per_req=2,
             max_num_slots=8, buckets=(2, 4), graph_backend="emulated", num_logprobs=2)


def _python(code: str, **env) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (imports and the environment start clean)."""
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**base, **env})


# -- the package -------------------------------------------------------------------------------
def test_version_matches_pyproject_and_the_package_is_typed():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert graphshard.__version__ == project["project"]["version"]
    assert (ROOT / "graphshard" / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["graphshard"]


def test_errors_form_one_family_and_keep_their_old_homes():
    for cls in (InvalidTypeError, InvalidSlotError, InvalidParamsError, BatchTooLargeError,
                RankDivergenceError):
        assert issubclass(cls, InvalidBatchError)
    assert issubclass(InvalidBatchError, ValueError) and issubclass(ConfigError, ValueError)
    assert issubclass(InvalidTypeError, TypeError)  # `except TypeError` still catches dtype errors
    assert issubclass(StepFault, RuntimeError) and issubclass(EngineStateError, RuntimeError)
    from graphshard import config
    from graphshard.engine import agreement, faults, validate
    assert validate.InvalidBatchError is InvalidBatchError and faults.StepFault is StepFault
    assert agreement.RankDivergenceError is RankDivergenceError and config.ConfigError is ConfigError
    with pytest.raises(InvalidTypeError, match=r"^SamplingParams\.top_k = "):
        SamplingParams(top_k=1.5)
    with pytest.raises(InvalidParamsError, match=r"^SamplingParams\.top_p = "):
        SamplingParams(top_p=0.0)


def test_import_is_light_and_chooses_the_interpreter_without_cuda():
    code = "import os, sys, graphshard; print('triton' in sys.modules, os.environ.get('TRITON_INTERPRET'))"
    loaded, interpret = _python(code).stdout.split()
    assert loaded == "False"  # no Triton (and no kernel) until the engine is used
    assert interpret == ("None" if torch.cuda.is_available() else "1")
    # An explicit choice is left alone.
    assert _python(code, TRITON_INTERPRET="0").stdout.split()[1] == "0"


def test_a_cpu_engine_without_the_interpreter_fails_at_construction():
    code = ("from graphshard import Engine, Config\n"
            "Engine(Config(vocab_size=50, max_num_reqs=2), device='cpu')\n")
    result = _python(code, TRITON_INTERPRET="0")
    assert result.returncode != 0
    assert "EngineStateError" in result.stderr and "Set TRITON_INTERPRET=1" in result.stderr, result.stderr


# -- one process --------------------------------------------------------------------------------
def _engine(cfg=CFG, capture=True) -> Engine:
    engine = Engine(cfg)
    if capture:
        engine.capture()
    return engine


def test_add_request_refuses_an_active_slot_unless_replacing():
    engine = _engine(capture=False)
    engine.add_request(3, SamplingParams(temperature=0.0))
    before = engine.tables.packed.clone()
    with pytest.raises(InvalidSlotError, match="slot 3 already holds a request.*replace=True"):
        engine.add_request(3, SamplingParams(temperature=0.5))
    assert torch.equal(before, engine.tables.packed)
    engine.add_request(3, SamplingParams(temperature=0.5), replace=True)
    assert float(engine.tables.temperature[3]) == 0.5
    with pytest.raises(InvalidSlotError, match=r"slot 8 out of range \[0, 8\)"):
        engine.add_request(8, SamplingParams())
    with pytest.raises(InvalidTypeError, match="slot must be an integer"):
        engine.add_request(1.0, SamplingParams())
    engine.remove_request(3)
    with pytest.raises(InvalidSlotError, match="slot 3 holds no request"):
        engine.remove_request(3)
    engine.add_request(3, SamplingParams())  # free again: no replace needed


def test_to_host_is_one_copy_split_into_numpy_arrays():
    engine = _engine()
    engine.add_request(0, SamplingParams(temperature=0.0, num_logprobs=2))
    engine.add_request(5, SamplingParams(temperature=0.9, seed=7))
    logits = torch.randn(3, engine.vocab_shard, generator=torch.Generator().manual_seed(0))
    logits[2, 11] = float("nan")  # request 1's only row: it still samples, and num_nans says so
    greedy = int(logits[0, :CFG.vocab_size].argmax())
    drafts = torch.tensor([greedy, -1, -1], dtype=torch.int32)  # request 0 verifies one draft
    out = engine.step(np.array([0, 5], np.int32), np.array([0, 2, 3], np.int32),
                      np.array([10, 4], np.int32), logits, draft_token_ids=drafts)
    host = out.to_host()
    assert isinstance(host.sampled_token_ids, np.ndarray) and host.sampled_token_ids.shape == (2, 2)
    for name in ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans", "topk_ids",
                 "topk_logprobs", "sampled_logprob", "sampled_rank"):
        np.testing.assert_array_equal(getattr(host, name), getattr(out, name).numpy())
    assert host.topk_logprobs.dtype == np.float32
    assert host.tokens(0)[0] == greedy and len(host.tokens(0)) == host.num_sampled[0] == 2
    assert host.num_nans.tolist() == [0, 1] and len(host.tokens(1)) == 1
    kept = host.records.copy()
    engine.step(np.array([5], np.int32), np.array([0, 1], np.int32), np.array([5], np.int32),
                logits[:1] * 2)
    assert np.array_equal(kept, host.records)  # the copy is the caller's


def test_read_gives_each_of_the_last_two_steps_its_own_records():
    """tp = 1: `read` copies the records the step's last kernel published to host memory; they
    equal the device records of that step, for captured, eager (above the largest bucket) and
    uncaptured steps, and only the last two issued steps (since capture) can be read."""
    engine = _engine(CFG.replace(buckets=(1, 2)), capture=False)
    for slot in range(8):
        engine.add_request(slot, SamplingParams(temperature=0.0 if slot % 3 else 0.8, seed=slot,
                                                num_logprobs=slot % 3))
    gen = torch.Generator().manual_seed(3)

    def step(n):
        logits = torch.randn(2 * n, engine.vocab_shard, generator=gen)
        cu = np.arange(0, 2 * n + 1, 2, dtype=np.int32)
        drafts = torch.randint(0, CFG.vocab_size, (2 * n,), generator=gen, dtype=torch.int32)
        return engine.step(np.arange(n, dtype=np.int32) * 2 % 8, cu, np.full(n, 4, np.int32),
                           logits, draft_token_ids=drafts).to_host()

    with pytest.raises(ValueError, match="no step can be read"):
        engine.read()
    uncaptured = step(3)
    assert np.array_equal(engine.read().records, uncaptured.records)
    engine.capture()
    with pytest.raises(ValueError, match="no step can be read"):
        engine.read(0)  # the capture's placeholder batches ran over it
    done = []
    for n in (1, 4, 2, 3, 1):  # 3 and 4: above the largest bucket, eager steps
        done.append(step(n))
        got = engine.read()
        assert engine.inputs.staged.finished() == engine.steps - 1  # the publish's done word
        assert got.records.shape == (n, engine.layout.width)
        for name in ("sampled_token_ids", "num_sampled", "topk_ids", "topk_logprobs",
                     "sampled_rank"):
            np.testing.assert_array_equal(getattr(got, name), getattr(done[-1], name))
        if len(done) > 1:
            assert np.array_equal(engine.read(engine.steps - 2).records, done[-2].records)
    kept = got.records.copy()
    step(2)
    assert np.array_equal(kept, got.records)  # the copy is the caller's
    for bad in (engine.steps - 3, engine.steps, -1, 1.0, True):
        with pytest.raises(ValueError, match=f"steps {engine.steps - 2}..{engine.steps - 1} can"):
            engine.read(bad)


def test_shard_columns_and_the_padded_vocabulary():
    engine = _engine(capture=False)
    assert engine.vocab == 96 and engine.shard_columns() == (0, 96)  # 90 padded to a multiple of 8
    with pytest.raises(ValueError, match="rank must be"):
        engine.shard_columns(1)


def test_the_engine_refuses_calls_after_close():
    engine = _engine()
    engine.add_request(0, SamplingParams())
    engine.close()
    engine.close()  # harmless
    batch = (np.array([0], np.int32), np.array([0, 1], np.int32), np.zeros(1, np.int32),
             torch.zeros(1, engine.vocab_shard))
    with pytest.raises(EngineStateError, match=r"step\(\) on a closed engine"):
        engine.step(*batch)
    for call, args in (("add_request", (1, SamplingParams())), ("remove_request", (0,)),
                       ("capture", ())):
        with pytest.raises(EngineStateError, match=rf"{call}\(\) on a closed engine"):
            getattr(engine, call)(*args)
    assert engine.stats()["replays"]  # still answers
    with pytest.raises(EngineStateError, match="already ran"):
        _engine().capture()  # a second capture() on an open engine


def test_uncaptured_steps_warn_once_where_they_would_be_slow():
    engine = _engine(capture=False)
    engine.add_request(0, SamplingParams(temperature=0.0))
    batch = (np.array([0], np.int32), np.array([0, 1], np.int32), np.zeros(1, np.int32),
             torch.zeros(1, engine.vocab_shard))
    assert not engine._warn_uncaptured  # a CPU engine: eager steps are what it has
    # What rank 0 of a CUDA engine starts with: one warning, whatever the number of steps.
    engine._warn_uncaptured = True
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            engine.step(*batch)
    assert [str(w.message) for w in seen if w.category is RuntimeWarning] == [
        "graphshard: steps are running without CUDA graphs (capture() was not called); "
        "call engine.capture() once after building the engine"]


# -- two processes ------------------------------------------------------------------------------
TIMEOUT_S = 4.0
SLACK_S = 25.0  # interpreted kernels and a loaded 2-core machine


def _capture_on_some_ranks(rank, world):
    """capture() on rank 0 alone, then late on rank 1; then on both; then rank 1 steps while
    rank 0 captures a second engine. What each call raised, and how long it took."""
    import time

    import torch.distributed as dist

    cfg = CFG.replace(transport="gloo", timeout_s=TIMEOUT_S)
    engine = Engine(cfg)
    got = {"columns": [engine.shard_columns(r) for r in range(world)], "vocab": engine.vocab}

    def attempt(name, fn):
        start = time.monotonic()
        try:
            fn()
            got[name] = ("ok", time.monotonic() - start)
        except Exception as e:  # noqa: BLE001 - the type is what the test checks
            got[name] = (type(e).__name__, str(e), time.monotonic() - start)

    if rank == 0:
        attempt("alone", engine.capture)
    dist.barrier()  # rank 1 waits here (a collective while rank 0 is in the store, not in one)
    if rank == 1:
        attempt("late", engine.capture)
    attempt("together", engine.capture)
    for slot in range(2):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    shard = torch.arange(2 * engine.vocab_shard, dtype=torch.float32).view(2, -1).flip(1) + rank
    got["tokens"] = engine.step(np.arange(2, dtype=np.int32), np.arange(3, dtype=np.int32),
                                np.zeros(2, np.int32), shard).to_host().tokens(1)
    got["read"] = engine.read().tokens(1)
    try:
        engine.read(engine.steps - 2)
    except ValueError as e:  # tp > 1: only the last issued step
        got["read_earlier"] = str(e)
    second = Engine(cfg)  # collective: built on both ranks
    second.add_request(0, SamplingParams(temperature=0.0))
    if rank == 0:
        attempt("while_peer_steps", second.capture)
    else:
        attempt("while_peer_steps", lambda: second.step(np.zeros(1, np.int32), np.arange(2, dtype=np.int32),
                                                        np.zeros(1, np.int32), shard[:1]))
    return got


def test_capture_on_a_subset_of_ranks_raises_on_every_rank_that_called_it():
    r0, r1 = spawn(_capture_on_some_ranks, 2, timeout_s=600)
    assert r0["columns"] == r1["columns"] == [(0, 48), (48, 96)] and r0["vocab"] == 96
    kind, message, elapsed = r0["alone"]
    assert kind == "RankDivergenceError" and TIMEOUT_S <= elapsed <= TIMEOUT_S + SLACK_S
    assert message.startswith("capture() was called on ranks [0] but not on ranks [1] within "
                              "timeout_s = 4 s"), message
    kind, message, elapsed = r1["late"]
    assert kind == "RankDivergenceError" and elapsed < TIMEOUT_S
    assert message.startswith("capture() came too late on rank 1: ranks [0] called it"), message
    assert r0["together"][0] == r1["together"][0] == "ok"  # the group is intact
    assert r0["tokens"] == r1["tokens"] == [48]  # the column with the largest logit (rank 1's + 1)
    assert r0["read"] == r1["read"] == [48]
    assert r0["read_earlier"] == r1["read_earlier"] == \
        "read(step=-1): step 0 can be read now (the last issued step)"
    # No gloo abort: the stepping rank's collective times out, the capturing rank's meeting too.
    assert r0["while_peer_steps"][0] == "RankDivergenceError"
    assert r1["while_peer_steps"][0] == "StepFault"
