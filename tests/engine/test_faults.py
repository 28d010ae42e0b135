"""Faults on CPU: a rank that dies, gives up or refuses its tensors mid-run makes its peers fail
within the configured bound with an error naming the cause; `check_agreement` turns diverging
ranks into the same error on every rank."""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from graphshard.engine.agreement import RankDivergenceError
from graphshard.config import Config
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.engine.faults import StepFault, Watchdog
from graphshard.sample.params import SamplingParams
from graphshard.engine.validate import InvalidBatchError

TIMEOUT_S = 4.0
# What a surviving rank may add to the bound on a loaded 2-core machine: the interpreted kernels
# of the failing step and the store look-up.
SLACK_S = 25.0
CFG = Config(vocab_size=120, vocab_pad_multiple=8, max_num_reqs=6, max_num_slots=8, buckets=(2, 4),
             graph_backend="emulated", timeout_s=TIMEOUT_S)
FAULT_STEP = 3
BATCH = (np.arange(4, dtype=np.int32), np.arange(5, dtype=np.int32), np.zeros(4, np.int32))


def _greedy_engine(cfg: Config) -> Engine:
    engine = Engine(cfg)
    engine.capture()
    for slot in range(4):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    return engine


def _run_until_fault(rank, world, cfg, victim, mode, outdir):
    """Step until the victim fails at FAULT_STEP; every other rank records how its step failed."""
    engine = _greedy_engine(cfg)
    shard = torch.randn(4, engine.vocab_shard, generator=torch.Generator().manual_seed(rank))
    record = {"rank": rank}
    for step in range(FAULT_STEP + 2):
        if rank == victim and step == FAULT_STEP:
            if mode == "die":
                os._exit(17)
            if mode == "die_mid_step":  # after the exchange, before the call that ends the step
                last = "close" if cfg.strategy == "replicate" else "gather"
                setattr(engine.transport, last, lambda *args, **kwargs: os._exit(17))
            if mode == "give_up":
                engine.fail("the model forward raised: CUDA out of memory")
                _stay_out(outdir, world, victim)
                break
            if mode == "refuse":  # this rank's own tensor is wrong
                shard = shard.double()
        start = time.monotonic()
        try:
            engine.step(*BATCH, shard)
        except (StepFault, InvalidBatchError, TypeError) as e:
            record.update(step=step, elapsed=time.monotonic() - start, error=type(e).__name__,
                          message=str(e))
            if rank == victim:  # its peers are inside the step: it must not step again
                try:
                    engine.step(*BATCH, shard.float())
                except StepFault as again:
                    record["refused_after"] = str(again)
                _stay_out(outdir, world, victim)
                break
            try:
                engine.step(*BATCH, shard.float())
            except StepFault as again:
                record["refused_after"] = str(again)
            break
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(record))
    return record


def _stay_out(outdir, world, victim):
    """Stay alive without stepping until every peer has recorded its failure."""
    deadline = time.monotonic() + TIMEOUT_S + SLACK_S
    while time.monotonic() < deadline and len(list(Path(outdir).glob("rank*.json"))) < world - 1:
        time.sleep(0.1)


def _outcomes(tmp_path, world, cfg, victim, mode) -> dict[int, dict]:
    args = (_run_until_fault, world, cfg, victim, mode, str(tmp_path))
    if mode in ("die", "die_mid_step"):
        with pytest.raises(RuntimeError, match="exited with code 17"):
            spawn(*args, timeout_s=300, failure_grace_s=TIMEOUT_S + SLACK_S + 20)
    else:
        spawn(*args, timeout_s=300)
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}


@pytest.mark.parametrize("transport, world, mode, strategy", [
    ("gloo", 3, "die", "shard"), ("gloo", 2, "give_up", "shard"), ("gloo", 2, "refuse", "shard"),
    ("p2p", 2, "die", "shard"), ("p2p", 2, "give_up", "shard"),
    # Three ranks: two peers wait on the dead one. Dying inside a step: the peers wait at the
    # barrier that ends it (the record push; the close of a replicate step).
    ("p2p", 2, "die", "replicate"), ("p2p", 3, "die", "shard"),
    ("p2p", 2, "die_mid_step", "shard"), ("p2p", 3, "die_mid_step", "replicate"),
    ("gloo", 2, "die_mid_step", "shard"),
])
def test_peers_fail_within_the_bound_naming_the_cause(tmp_path, transport, world, mode, strategy):
    victim = world - 1
    got = _outcomes(tmp_path, world, CFG.replace(transport=transport, strategy=strategy), victim,
                    mode)
    for rank in range(world - 1):
        r = got[rank]
        print(f"{transport} {mode}: rank {rank} failed after {r['elapsed']:.2f} s: {r['message']}")
        assert r["step"] == FAULT_STEP and r["error"] == "StepFault", r
        assert r["elapsed"] <= TIMEOUT_S + SLACK_S, r
        assert "broken by an earlier fault" in r["refused_after"]  # no second collective
        cause = r["message"].splitlines()[0]  # the peer's reason leads, transport details after
        if mode == "give_up":
            assert cause == f"rank {victim}: gave up: the model forward raised: CUDA out of memory", r
        if mode == "refuse":
            assert cause.startswith(f"rank {victim}: gave up: step {FAULT_STEP}: its own tensors were "
                                    "refused: InvalidTypeError: logits must be torch.float32"), r
        if transport == "p2p":
            assert f"waiting for rank {victim}" in r["message"], r
        if transport == "p2p" and mode == "die_mid_step":
            end = "step close" if strategy == "replicate" else "record push"
            assert f"p2p {end} end barrier on rank {rank} gave up" in r["message"], r
    if mode == "refuse":
        assert got[victim]["error"] == "InvalidTypeError" and got[victim]["step"] == FAULT_STEP
        assert "its own tensors were refused" in got[victim]["refused_after"]


def _diverging_ranks(rank, world):
    """Each mistake below on rank 1 only: with the check on, every rank raises the same error,
    nothing runs, and the engine stays usable."""
    engine = _greedy_engine(CFG.replace(transport="gloo", check_agreement=True))
    shard = torch.randn(4, engine.vocab_shard, generator=torch.Generator().manual_seed(rank))
    idx, cu, lens = BATCH
    errors = []

    def attempt(*args):
        try:
            engine.step(*args)
        except InvalidBatchError as e:
            errors.append((type(e).__name__, str(e)))

    attempt(idx, cu, lens + (rank == 1), shard)  # different seq_lens
    attempt(idx[::-1].copy() if rank == 1 else idx, cu, lens, shard)  # a different order
    attempt(idx, cu, lens, shard.double() if rank == 1 else shard)  # this rank's tensor
    engine.add_request(4, SamplingParams(temperature=0.0 if rank == 0 else 0.7))
    attempt(np.arange(5, dtype=np.int32), np.arange(6, dtype=np.int32), np.zeros(5, np.int32),
            torch.cat([shard, shard[:1]]))
    engine.add_request(4, SamplingParams(temperature=0.0), replace=True)  # the ranks agree again
    if rank == 0:
        engine.add_request(5, SamplingParams(temperature=0.0))  # rank 1 misses this one
    attempt(np.array([0, 5], np.int32), np.arange(3, dtype=np.int32), np.zeros(2, np.int32), shard[:2])
    if rank == 0:
        engine.remove_request(5)
    out = engine.step(idx, cu, lens, shard)
    return errors, out.sampled_token_ids[:, 0].tolist(), engine.stats()["replays"]


def test_agreement_check_raises_on_every_rank_and_the_engine_recovers():
    (e0, tok0, replays0), (e1, tok1, _) = spawn(_diverging_ranks, 2, timeout_s=300)
    assert e0 == e1 and len(e0) == 5
    kinds = [kind for kind, _ in e0]
    assert kinds == ["RankDivergenceError", "RankDivergenceError", "InvalidBatchError",
                     "RankDivergenceError", "RankDivergenceError"]
    assert "replicated step inputs" in e0[0][1] and "ranks [1]" in e0[0][1]
    assert "rank 1: InvalidTypeError" in e0[2][1] and "float32" in e0[2][1]
    assert "sampling parameters" in e0[3][1]
    assert "only some ranks refused" in e0[4][1] and "rank 1: InvalidBatchError: slot 5" in e0[4][1]
    assert tok0 == tok1 and sum(replays0.values()) == 1  # only the last step ran


def test_p2p_barrier_gives_up_after_the_timeout_and_stays_failed():
    results = spawn(_lonely_barrier, 2, timeout_s=300)
    elapsed, fault, again_s, fault_again = results[0]
    assert 2.0 <= elapsed <= 2.0 + SLACK_S
    assert fault == "p2p barrier phase 1 barrier on rank 0 gave up after 2 s waiting for rank 1"
    assert again_s < 2.0 and fault_again == fault  # later barriers give up at once


def _lonely_barrier(rank, world):
    from graphshard.transports import make_transport

    transport = make_transport("p2p", None, "cpu", timeout_s=2.0)
    transport.setup(max_num_rows=2, max_num_reqs=2, vocab_shard=8, logits_dtype=torch.float32,
                    record_width=4)
    torch.distributed.barrier()
    if rank == 1:
        return None  # never joins
    timings = []
    for _ in range(2):
        start = time.monotonic()
        transport.barrier()
        timings += [time.monotonic() - start, transport.fault()]
    return tuple(timings)


def test_config_checks_the_fault_fields():
    with pytest.raises(ValueError, match="timeout_s"):
        Config(vocab_size=10, max_num_reqs=2, timeout_s=0)
    with pytest.raises(ValueError, match="check_agreement"):
        Config(vocab_size=10, max_num_reqs=2, check_agreement="yes")


def test_rank_divergence_error_is_an_invalid_batch():
    assert issubclass(RankDivergenceError, InvalidBatchError)


class _Event:
    def __init__(self, done: bool):
        self.done = done

    def query(self) -> bool:
        return self.done


class _Group:
    """Stands in for an NCCL group: records the abort the watchdog must send."""

    def __init__(self):
        self.aborts = 0

    def _get_backend(self, device):
        assert device.type == "cuda"
        return self

    def abort(self):
        self.aborts += 1


def test_watchdog_aborts_the_group_once_when_a_step_overruns():
    group = _Group()
    watchdog = Watchdog(group, limit_s=0.4)
    watchdog.watch(7, _Event(done=False))  # labelled "step 7"
    time.sleep(1.0)  # the thread's own check, with no caller waiting
    assert watchdog.fault == "step 7 did not finish within 0.4 s of its issue"
    assert group.aborts == 1
    assert watchdog.wait() == watchdog.fault and group.aborts == 1
    watchdog.close()


def test_watchdog_passes_finished_steps_and_bounds_the_callers_wait():
    group = _Group()
    watchdog = Watchdog(group, limit_s=0.5)
    watchdog.watch(1, _Event(done=True))
    assert watchdog.wait() is None
    watchdog.watch(2, _Event(done=False))
    start = time.monotonic()
    assert watchdog.wait() == "step 2 did not finish within 0.5 s of its issue"
    assert time.monotonic() - start < 1.5 and group.aborts == 1
    watchdog.close()


def test_a_disarmed_watchdog_never_times_the_next_step_from_the_last_issue():
    group = _Group()
    watchdog = Watchdog(group, limit_s=0.4)
    watchdog.watch(1, _Event(done=False))
    watchdog.disarm()  # what the engine does before recording the next step's event
    time.sleep(1.0)
    assert watchdog.fault is None and group.aborts == 0
    watchdog.close()
