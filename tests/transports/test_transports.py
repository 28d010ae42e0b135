"""Transports on CPU: gloo (padded all-to-all) and p2p (the real kernels under the Triton
interpreter, shared-file peer mappings), tp 1-3 in spawned processes, many plans per spawn."""

from __future__ import annotations

import logging
import os
import pickle
import queue
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from graphshard.harness import distributed
from graphshard.harness.distributed import spawn
from graphshard.plan.layout import PlanBuffers, owner_counts, owner_ranks
from graphshard.plan.reference import plan_ref
from graphshard.plan.staging import Staging
from graphshard.transports import (P2PTransport, PaddedTransport, doubling_tiers, make_transport,
                                   pick_tier)

MAX_REQS = 10
MAX_M = 3  # logits rows per request
MAX_ROWS = MAX_REQS * MAX_M
MAX_SLOTS = 128  # one owner of 8 still holds MAX_REQS slots
VOCAB_SHARD = 5
WIDTH = 4  # record width

needs_interpreter = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="p2p kernels on CPU run under TRITON_INTERPRET=1")


# -- inputs and expectations (identical on every rank: same seed) ------------------------------
def random_batch(rng: np.random.Generator, n: int, tp: int, mode: str):
    """Unique slots; mode "random", "one_owner" (every request on one rank) or "skip_owner"
    (one rank owns nothing)."""
    slots = np.arange(MAX_SLOTS)
    if mode == "one_owner":
        slots = slots[owner_ranks(slots, tp) == rng.integers(tp)]
    elif mode == "skip_owner" and tp > 1:
        slots = slots[owner_ranks(slots, tp) != rng.integers(tp)]
    idx_mapping = rng.choice(slots, size=n, replace=False).astype(np.int32)
    m = rng.integers(1, MAX_M + 1, size=n)
    cu = np.concatenate([[0], np.cumsum(m)]).astype(np.int32)
    seq_lens = rng.integers(1, 100, size=n).astype(np.int32)
    return idx_mapping, cu, seq_lens


def make_plan(batch, tp: int, rank: int, gather_stride: int) -> PlanBuffers:
    fields = plan_ref(*batch, tp_size=tp, tp_rank=rank, max_num_reqs=MAX_REQS,
                      max_num_logits_per_req=MAX_M, gather_stride=gather_stride)
    return PlanBuffers(**{k: torch.from_numpy(v) for k, v in fields.items()})


def owner_max(batch, tp: int) -> tuple[int, int]:
    """(max requests, max logits rows) any owner holds: what the host knows before the step."""
    reqs, rows = owner_counts(batch[0], batch[1], tp)
    return int(reqs.max(initial=0)), int(rows.max(initial=0))


def cases(rng: np.random.Generator, tp: int, count: int):
    fixed = [(0, "random"), (MAX_REQS, "random"), (MAX_REQS, "one_owner"), (1, "random"),
             (MAX_REQS // 2, "skip_owner"), (MAX_REQS, "skip_owner")]
    modes = ("random", "random", "one_owner", "skip_owner")
    for i in range(count):
        n, mode = fixed[i] if i < len(fixed) else (int(rng.integers(0, MAX_REQS + 1)),
                                                   modes[rng.integers(len(modes))])
        yield random_batch(rng, n, tp, mode)


# -- the per-rank check ------------------------------------------------------------------------
def check_transport(rank: int, tp: int, kind: str, dtype: torch.dtype, seed: int, num_cases: int,
                    vocab_shard: int = VOCAB_SHARD):
    transport = make_transport(kind, None, "cpu")
    expected_type = P2PTransport if kind == "p2p" else PaddedTransport
    assert isinstance(transport, expected_type), f"{kind} gave {type(transport).__name__}"
    transport.setup(max_num_rows=MAX_ROWS, max_num_reqs=MAX_REQS, vocab_shard=vocab_shard,
                    logits_dtype=dtype, record_width=WIDTH)
    rng = np.random.default_rng(seed)
    vocab = tp * vocab_shard
    rows_out = torch.empty(MAX_ROWS, vocab, dtype=dtype)
    recs_out = torch.empty(MAX_REQS, WIDTH, dtype=torch.int32)
    checked = 0
    for case, batch in enumerate(cases(rng, tp, num_cases)):
        n, num_logits = batch[0].shape[0], int(batch[1][-1])
        bucket = int(rng.integers(max(n, 1), MAX_REQS + 1))
        bucket_rows = bucket * MAX_M
        # Logits rows past num_logits are junk the transport must never deliver as real rows.
        full = torch.from_numpy(rng.standard_normal((bucket_rows, vocab)).astype(np.float32)).to(dtype)
        shard = full[:, rank * vocab_shard:(rank + 1) * vocab_shard].contiguous()
        max_reqs, max_rows = owner_max(batch, tp)
        tiers = transport.capacity_tiers(bucket_rows)
        capacity = transport.pick_capacity(bucket_rows, max_rows)
        assert capacity >= max_rows and capacity in tiers
        if case % 3 == 2:  # a larger tier than needed must work too
            capacity = tiers[-1]
        capacity_reqs = transport.pick_capacity(bucket, max_reqs)
        plan = make_plan(batch, tp, rank, capacity_reqs)
        where = f"rank {rank} case {case} n={n} rows={num_logits} bucket={bucket} cap={capacity}"

        # exchange: this rank's owned rows, full vocabulary, owner-sorted (batch order within)
        rows_out.fill_(float("nan"))
        got = transport.exchange(plan, shard, rows_out if case % 2 else None, capacity)
        local_rows = int(plan.local_num_rows)
        want = full[plan.local_row_src[:local_rows].long()]
        torch.testing.assert_close(got[:local_rows], want, rtol=0, atol=0, msg=where)

        # gather: every rank ends with every request's record, batch order
        records = torch.full((MAX_REQS, WIDTH), -1, dtype=torch.int32)
        local = int(plan.local_num_reqs)
        records[:local] = (plan.local_req_indices[:local, None] * 100
                           + torch.arange(WIDTH, dtype=torch.int32) + 7)
        recs_out.fill_(-99)
        got = transport.gather(plan, records, recs_out if case % 2 == 0 else None, capacity_reqs,
                               bucket)
        want = torch.arange(n, dtype=torch.int32)[:, None] * 100 + torch.arange(WIDTH) + 7
        assert torch.equal(got[:n], want.to(torch.int32)), f"{where}: gather\n{got[:n]}\n{want}"

        # all_gather_vocab: the replicate strategy's exchange
        num_rows = int(rng.integers(0, bucket_rows + 1))
        rows_out.fill_(float("nan"))
        got = transport.all_gather_vocab(shard, rows_out if case % 2 else None, num_rows)
        torch.testing.assert_close(got[:num_rows], full[:num_rows], rtol=0, atol=0, msg=where)
        checked += 1
    transport.barrier()
    return {"name": transport.name, "checked": checked}


def check_transports(rank: int, tp: int, configs):
    """Several transports in one spawn: (kind, dtype, seed, num_cases, vocab_shard) each."""
    return [check_transport(rank, tp, *config) for config in configs]


# -- spawned checks ----------------------------------------------------------------------------
def configs_for(kind: str, tp: int) -> list[tuple]:
    num_cases = {"gloo": {1: 8, 2: 40, 3: 30, 4: 12, 8: 6}, "p2p": {1: 4, 2: 24, 3: 12, 4: 6}}[kind][tp]
    configs = [(kind, torch.float32, 1234 + tp, num_cases, VOCAB_SHARD)]
    if tp == 2:
        configs.append((kind, torch.bfloat16, 77, 8, VOCAB_SHARD))
        # 4100 columns: two column chunks per row in the p2p kernel, the second one partial.
        configs.append((kind, torch.float32, 3, 8, 4100))
    return configs


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 8])
def test_gloo_transport(tp):
    configs = configs_for("gloo", tp)
    results = spawn(check_transports, tp, configs, timeout_s=180)
    assert results == [[{"name": "gloo", "checked": c[3]} for c in configs]] * tp


@needs_interpreter
@pytest.mark.parametrize("tp", [1, 2, 3, 4])
def test_p2p_transport_interpreted(tp):
    configs = configs_for("p2p", tp)
    results = spawn(check_transports, tp, configs, timeout_s=300)
    assert results == [[{"name": "p2p", "checked": c[3]} for c in configs]] * tp


# -- steps that end closed --------------------------------------------------------------------
def check_closed_steps(rank: int, tp: int, kind: str, seed: int, num_steps: int):
    """The transport calls of a decode loop: every step is exchange + gather (shard) or
    all-gather + close (replicate), its push unfenced since the step before ended closed, and
    the call that ends it raises the step's done word. Batch, bucket and strategy change every
    step (the same on every rank); a barrier now and then, as between captures. One rank is slow
    to read what it was sent each step: a peer that did not wait for it at the step's end would
    overwrite its rows (and re-raise flags it has not consumed) in the next step."""
    transport = make_transport(kind, None, "cpu")
    transport.setup(max_num_rows=MAX_ROWS, max_num_reqs=MAX_REQS, vocab_shard=VOCAB_SHARD,
                    logits_dtype=torch.float32, record_width=WIDTH)
    staging = Staging(MAX_REQS, torch.device("cpu"))
    rng = np.random.default_rng(seed)
    vocab = tp * VOCAB_SHARD
    strategies = []
    for step in range(num_steps):
        staging.meta[:2].view(torch.int64)[0] = step  # what the step's fetch leaves in meta
        batch = random_batch(rng, int(rng.integers(0, MAX_REQS + 1)), tp,
                             ("random", "one_owner", "skip_owner")[step % 3])
        n = batch[0].shape[0]
        bucket = int(rng.integers(max(n, 1), MAX_REQS + 1))
        full = torch.from_numpy(rng.standard_normal((bucket * MAX_M, vocab)).astype(np.float32))
        shard = full[:, rank * VOCAB_SHARD:(rank + 1) * VOCAB_SHARD].contiguous()
        where = f"rank {rank} step {step} n={n} bucket={bucket}"
        strategies.append(("replicate", "shard")[int(rng.integers(2))])
        if strategies[-1] == "shard":
            max_reqs, max_rows = owner_max(batch, tp)
            capacity = transport.pick_capacity(bucket * MAX_M, max_rows)
            capacity_reqs = transport.pick_capacity(bucket, max_reqs)
            plan = make_plan(batch, tp, rank, capacity_reqs)
            got = transport.exchange(plan, shard, None, capacity, fenced=False)
            _dawdle(rank, step, tp)
            local_rows = int(plan.local_num_rows)
            want = full[plan.local_row_src[:local_rows].long()]
            torch.testing.assert_close(got[:local_rows], want, rtol=0, atol=0, msg=where)
            records = torch.full((MAX_REQS, WIDTH), -1, dtype=torch.int32)
            local = int(plan.local_num_reqs)
            records[:local] = (plan.local_req_indices[:local, None] * 100 + step
                               + torch.arange(WIDTH, dtype=torch.int32))
            got = transport.gather(plan, records, None, capacity_reqs, bucket, done=staging)
            want = torch.arange(n, dtype=torch.int32)[:, None] * 100 + step + torch.arange(WIDTH)
            assert torch.equal(got[:n], want.to(torch.int32)), f"{where}: gather"
        else:
            num_rows = int(rng.integers(0, bucket * MAX_M + 1))
            got = transport.all_gather_vocab(shard, None, num_rows, fenced=False)
            _dawdle(rank, step, tp)
            torch.testing.assert_close(got[:num_rows], full[:num_rows], rtol=0, atol=0, msg=where)
            transport.close(done=staging)
        assert staging.finished() == step, where
        if step % 7 == 6:
            transport.barrier()
    transport.barrier()
    dist.barrier()  # every rank is past every kernel: no flag is in flight
    idle = kind != "p2p" or not (transport._signals.any() or transport._arrivals.any())
    return {"steps": num_steps, "strategies": "".join(s[0] for s in strategies), "idle": idle}


def _dawdle(rank: int, step: int, tp: int):
    if rank == step % tp:
        time.sleep(0.05)


@pytest.mark.parametrize("kind, tp", [("gloo", 2), pytest.param("p2p", 2, marks=needs_interpreter),
                                      pytest.param("p2p", 3, marks=needs_interpreter)])
def test_closed_steps_back_to_back(kind, tp):
    steps = {2: 30, 3: 14}[tp]
    results = spawn(check_closed_steps, tp, kind, 5 + tp, steps, timeout_s=300)
    assert all(r == results[0] for r in results)
    r = results[0]
    assert r["steps"] == steps and r["idle"]
    assert "ss" in r["strategies"] and "rr" in r["strategies"] and "sr" in r["strategies"]


def error_of(fn, *args) -> str:
    try:
        fn(*args)
    except (TypeError, ValueError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def check_kind_selection(rank: int, tp: int):
    picked = {kind: make_transport(kind, None, "cpu").name for kind in ("auto", "gloo")}
    # p2p that cannot run falls back, with the reason logged.
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("graphshard.transports").addHandler(handler)
    interpret = os.environ.pop("TRITON_INTERPRET", None)
    try:
        picked["p2p without interpreter"] = make_transport("p2p", None, "cpu").name
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    errors = {"nccl on cpu": error_of(make_transport, "nccl", None, "cpu"),
              "unknown kind": error_of(make_transport, "carrier-pigeon", None, "cpu")}
    transport = make_transport("gloo", None, "cpu")
    errors["before setup"] = error_of(transport.exchange, None, torch.zeros(1, 3), None, 1)
    setup = dict(max_num_rows=4, max_num_reqs=2, vocab_shard=3, logits_dtype=torch.float32,
                 record_width=2)
    transport.setup(**setup)
    errors["setup twice"] = error_of(lambda: transport.setup(**setup))
    plan = PlanBuffers.allocate(2, 2, tp, "cpu")
    for name, bad in (("dtype", torch.zeros(4, 3, dtype=torch.float64)), ("width", torch.zeros(4, 2)),
                      ("strides", torch.zeros(3, 4).t())):
        errors[name] = error_of(transport.exchange, plan, bad, None, 4)
    errors["capacity"] = error_of(transport.exchange, plan, torch.zeros(4, 3), None, 5)
    errors["big plan"] = error_of(transport.exchange, PlanBuffers.allocate(3, 2, tp, "cpu"),
                                  torch.zeros(4, 3), None, 4)
    errors["records"] = error_of(transport.gather, plan, torch.zeros(2, 3, dtype=torch.int32),
                                 None, 2, 2)
    return picked, logged, errors


def test_make_transport_kinds_and_checks():
    (picked, logged, errors), = spawn(check_kind_selection, 1, timeout_s=60)
    assert picked == {"auto": "gloo", "gloo": "gloo", "p2p without interpreter": "gloo"}
    assert any("TRITON_INTERPRET" in m and "gloo" in m for m in logged), logged
    expected = {"nccl on cpu": "ValueError: the nccl transport moves CUDA",
                "unknown kind": "ValueError: transport kind must be one of",
                "before setup": "RuntimeError: PaddedTransport.setup() must run",
                "setup twice": "RuntimeError: setup() runs once",
                "dtype": "TypeError: logits_shard must be torch.float32",
                "width": "ValueError: logits_shard must be [rows, 3]",
                "strides": "ValueError: logits_shard must have contiguous columns",
                "capacity": "ValueError: capacity must be in [0, max_num_rows=4]",
                "big plan": "ValueError: plan holds up to 3 requests",
                "records": "ValueError: records must be [>= 2, 2]"}
    for name, start in expected.items():
        assert errors[name].startswith(start), (name, errors[name])


# -- spawn itself ------------------------------------------------------------------------------
def fail_on_rank0(rank: int, world_size: int):
    if rank == 0:
        raise ValueError("rank zero gives up")
    dist.barrier()  # never completes: the parent must kill this rank
    return rank


def sleep_forever(rank: int, world_size: int):
    time.sleep(600)


def return_rank_info(rank: int, world_size: int, tag: str):
    return {"rank": rank, "world": dist.get_world_size(), "tag": tag,
            "env": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
            "tensor": torch.full((2,), rank)}


def test_spawn_returns_in_rank_order():
    results = spawn(return_rank_info, 3, "x", timeout_s=60)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world"] == 3 and r["tag"] == "x" and r["env"] == "1" for r in results)
    assert torch.equal(results[2]["tensor"], torch.full((2,), 2))


def test_spawn_reports_the_failing_rank():
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="rank zero gives up") as info:
        spawn(fail_on_rank0, 2, timeout_s=60)
    assert "--- rank 0 ---" in str(info.value) and "ValueError" in str(info.value)
    assert time.monotonic() - start < 45


def test_spawn_reports_a_rank_that_cannot_join_the_group(tmp_path):
    # Run in this process: a rank past the world size fails gloo's group setup at once, which
    # the rank reports as such (spawn then starts every rank again).
    reports = queue.Queue()
    distributed._worker(return_rank_info, 3, 2, ("x",), "gloo", str(tmp_path / "store"), 5,
                        reports)
    rank, status, payload = reports.get_nowait()
    assert (rank, status) == (3, distributed._NO_GROUP) and "rank < size" in payload
    assert not dist.is_initialized()


def test_spawn_starts_again_when_the_group_does_not_form(monkeypatch):
    starts = []

    def once(fn, world_size, *args):
        starts.append(world_size)
        if len(starts) == 1:
            return {0: pickle.dumps(0)}, {1: "connectFullMesh failed"}, {1}
        return {r: pickle.dumps(r) for r in range(world_size)}, {}, set()

    monkeypatch.setattr(distributed, "_spawn_once", once)
    with pytest.warns(RuntimeWarning, match="rank 1 could not join the process group"):
        assert spawn(return_rank_info, 2, "x") == [0, 1]
    assert starts == [2, 2]
    # A failure of `fn` itself, or a second failed start, is raised as it is.
    for failed in ({1: "ValueError: no"}, set()), ({1: "connectFullMesh failed"}, {1}):
        starts.clear()
        monkeypatch.setattr(distributed, "_spawn_once",
                            lambda fn, world_size, *a, failed=failed: ({0: b""}, *failed))
        with pytest.raises(RuntimeError, match="1 of 2 ranks failed"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            spawn(return_rank_info, 2, "x")


def test_spawn_times_out():
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        spawn(sleep_forever, 2, timeout_s=6)
    assert time.monotonic() - start < 30


# -- capacity tiers (host only) ----------------------------------------------------------------
@pytest.mark.parametrize("bucket_rows,tp,expected", [
    (1, 2, (1,)),
    (8, 2, (8,)),
    (100, 2, (64, 100)),
    (256, 2, (160, 256)),
    (1024, 2, (640, 1024)),
    (1024, 8, (160, 320, 640, 1024)),
    (48, 3, (24, 48)),
    (100, 1, (100,)),
])
def test_doubling_tiers(bucket_rows, tp, expected):
    assert doubling_tiers(bucket_rows, tp) == expected


def test_doubling_tiers_properties():
    for tp in range(1, 9):
        for bucket_rows in range(1, 600):
            tiers = doubling_tiers(bucket_rows, tp)
            assert tiers[-1] == bucket_rows
            assert list(tiers) == sorted(set(tiers))
            assert tiers[0] >= min(bucket_rows, -(-bucket_rows // tp))  # the even split fits


def test_pick_tier():
    tiers = (160, 320, 640, 1024)
    assert pick_tier(tiers, 0) == 160
    assert pick_tier(tiers, 160) == 160
    assert pick_tier(tiers, 161) == 320
    assert pick_tier(tiers, 1024) == 1024
    for bad in (-1, 1025):
        with pytest.raises(ValueError):
            pick_tier(tiers, bad)
    with pytest.raises(ValueError):
        doubling_tiers(0, 2)
