"""nccl and p2p transports on 2 GPUs: eager equalities, captured CUDA graphs replayed with new plans
written into the static buffers (equal to eager), and a 2,000-replay loop over random plans."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from graphshard.harness.distributed import spawn
from graphshard.plan.layout import PlanBuffers, owner_counts, owner_ranks
from graphshard.plan.reference import plan_ref
from graphshard.transports import P2PTransport, PaddedTransport, make_transport

# GRAPHSHARD_GPU_TP=4 (or 8) runs these on more GPUs of one host.
TP = int(os.environ.get("GRAPHSHARD_GPU_TP", "2"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < TP,
                       reason=f"needs {TP} CUDA GPUs (GRAPHSHARD_GPU_TP)"),
]

MAX_REQS = 64
MAX_M = 3
MAX_ROWS = MAX_REQS * MAX_M
MAX_SLOTS = MAX_REQS * 8  # one owner of 8 still holds MAX_REQS slots
VOCAB_SHARD = 9000  # several 4096-wide chunks per row, the last one partial
WIDTH = 11
TYPES = {"nccl": PaddedTransport, "p2p": P2PTransport}


def random_batch(rng, n: int, tp: int):
    mode = rng.integers(4)
    slots = np.arange(MAX_SLOTS)
    if mode == 0:  # every request on one owner
        slots = slots[owner_ranks(slots, tp) == rng.integers(tp)]
    idx_mapping = rng.choice(slots, size=n, replace=False).astype(np.int32)
    m = rng.integers(1, MAX_M + 1, size=n)
    cu = np.concatenate([[0], np.cumsum(m)]).astype(np.int32)
    return idx_mapping, cu, rng.integers(1, 4096, size=n).astype(np.int32)


def owner_max(batch, tp: int) -> tuple[int, int]:
    reqs, rows = owner_counts(batch[0], batch[1], tp)
    return int(reqs.max(initial=0)), int(rows.max(initial=0))


def plan_arrays(batch, rank: int, gather_stride: int) -> dict[str, np.ndarray]:
    return plan_ref(*batch, tp_size=TP, tp_rank=rank, max_num_reqs=MAX_REQS,
                    max_num_logits_per_req=MAX_M, gather_stride=gather_stride)


def write_plan(plan: PlanBuffers, arrays: dict[str, np.ndarray]):
    for name, value in arrays.items():
        getattr(plan, name).copy_(torch.from_numpy(value))


class Step:
    """Static buffers and one step at a fixed bucket. Strategies: "shard" (exchange + record
    gather), "replicate" (all-gather of the vocab shards), "gather" (record gather alone)."""

    def __init__(self, transport, device, dtype, bucket: int, capacity: int, capacity_reqs: int,
                 use_out: bool, strategy: str = "shard"):
        self.t, self.bucket, self.strategy = transport, bucket, strategy
        self.capacity, self.capacity_reqs = capacity, capacity_reqs
        self.plan = PlanBuffers.allocate(MAX_REQS, MAX_M, TP, device)
        self.logits = torch.zeros(MAX_ROWS, VOCAB_SHARD, dtype=dtype, device=device)
        self.records = torch.zeros(MAX_REQS, WIDTH, dtype=torch.int32, device=device)
        # Without `out` the results stay in the transport's static buffers (zero-copy).
        self.rows_out = self.recs_out = None
        if use_out:
            self.rows_out = torch.zeros(MAX_ROWS, TP * VOCAB_SHARD, dtype=dtype, device=device)
            self.recs_out = torch.zeros(MAX_REQS, WIDTH, dtype=torch.int32, device=device)
        self.cols = torch.arange(WIDTH, dtype=torch.int32, device=device)

    def __call__(self) -> dict[str, torch.Tensor]:
        if self.strategy == "replicate":
            return {"ag": self.t.all_gather_vocab(self.logits, self.rows_out, self.bucket * MAX_M)}
        out = {}
        if self.strategy == "shard":
            out["rows"] = self.t.exchange(self.plan, self.logits, self.rows_out, self.capacity)
        # Records derive from the plan on the device, so a replay with a new plan gathers new data.
        torch.add(self.plan.local_req_indices[:, None] * 1000, self.cols[None, :] + 7, out=self.records)
        out["recs"] = self.t.gather(self.plan, self.records, self.recs_out, self.capacity_reqs,
                                    self.bucket)
        return out


def expected_sizes(step: Step, arrays, n: int) -> dict[str, int]:
    return {"rows": int(arrays["local_num_rows"][0]), "recs": n, "ag": step.bucket * MAX_M}


def mismatches(step: Step, outputs, arrays, full: torch.Tensor, n: int) -> torch.Tensor:
    """Count (on the device) elements that differ from the expectation."""
    sizes = expected_sizes(step, arrays, n)
    bad = torch.zeros((), dtype=torch.int64, device=full.device)
    if "rows" in outputs:
        src = torch.from_numpy(arrays["local_row_src"][:sizes["rows"]]).to(full.device).long()
        bad += (outputs["rows"][:sizes["rows"]] != full[src]).sum()
    if "recs" in outputs:
        want = torch.arange(n, device=full.device, dtype=torch.int32)[:, None] * 1000 + step.cols + 7
        bad += (outputs["recs"][:n] != want).sum()
    if "ag" in outputs:
        bad += (outputs["ag"][:sizes["ag"]] != full[:sizes["ag"]]).sum()
    return bad


def fill_logits(step: Step, full: torch.Tensor, rank: int, gen: torch.Generator):
    full.copy_(torch.randn(full.shape, generator=gen, device=full.device).to(full.dtype))
    step.logits.copy_(full[:, rank * VOCAB_SHARD:(rank + 1) * VOCAB_SHARD])


def random_fitting_batch(rng, step: Step):
    """A batch no larger than the bucket whose owners fit the captured capacities."""
    while True:
        batch = random_batch(rng, int(rng.integers(0, step.bucket + 1)), TP)
        max_reqs, max_rows = owner_max(batch, TP)
        if max_rows <= step.capacity and max_reqs <= step.capacity_reqs:
            return batch


def capture(step: Step, pool=None) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        step.outputs = step()
    return graph


def check_eager(rank: int, world_size: int, kind: str, seed: int, num_cases: int):
    device = torch.device("cuda", rank)
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        transport = make_transport(kind, None, device)
        assert isinstance(transport, TYPES[kind]), f"{kind} gave {type(transport).__name__}"
        transport.setup(max_num_rows=MAX_ROWS, max_num_reqs=MAX_REQS, vocab_shard=VOCAB_SHARD,
                        logits_dtype=dtype, record_width=WIDTH)
        rng = np.random.default_rng(seed)
        gen = torch.Generator(device).manual_seed(seed)
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for case in range(num_cases):
            n = [0, MAX_REQS, 1][case] if case < 3 else int(rng.integers(0, MAX_REQS + 1))
            bucket = int(rng.integers(max(n, 1), MAX_REQS + 1))
            batch = random_batch(rng, n, TP)
            max_reqs, max_rows = owner_max(batch, TP)
            capacity = transport.pick_capacity(bucket * MAX_M, max_rows)
            capacity_reqs = transport.pick_capacity(bucket, max_reqs)
            arrays = plan_arrays(batch, rank, capacity_reqs)
            full = torch.empty(MAX_ROWS, TP * VOCAB_SHARD, dtype=dtype, device=device)
            for strategy in ("shard", "replicate", "gather"):
                step = Step(transport, device, dtype, bucket, capacity, capacity_reqs,
                            use_out=case % 2 == 0, strategy=strategy)
                write_plan(step.plan, arrays)
                fill_logits(step, full, rank, gen)
                bad += mismatches(step, step(), arrays, full, n)
        transport.barrier()
        torch.cuda.synchronize(device)
        results[str(dtype)] = int(bad)
    if kind == "p2p":
        results["auto"] = type(make_transport("auto", None, device)).__name__
    return results


@pytest.mark.parametrize("kind", ["nccl", "p2p"])
def test_eager_equalities(kind):
    results = spawn(check_eager, TP, kind, 11, 60, backend="nccl", timeout_s=400)
    want = {"torch.float32": 0, "torch.bfloat16": 0}
    if kind == "p2p":
        want["auto"] = "P2PTransport"
    assert results == [want] * TP


def check_graphs(rank: int, world_size: int, kind: str, seed: int, num_replays: int):
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    transport = make_transport(kind, None, device)
    assert isinstance(transport, TYPES[kind]), f"{kind} gave {type(transport).__name__}"
    transport.setup(max_num_rows=MAX_ROWS, max_num_reqs=MAX_REQS, vocab_shard=VOCAB_SHARD,
                    logits_dtype=torch.float32, record_width=WIDTH)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device).manual_seed(seed)
    # Largest bucket first, one shared pool; the small-capacity graph only sees plans that fit.
    steps, graphs, pool = [], [], None
    layouts = ((MAX_REQS, -1, "shard"), (MAX_REQS, 0, "shard"), (MAX_REQS, -1, "replicate"),
               (8, -1, "shard"), (8, -1, "replicate"), (8, -1, "gather"), (1, -1, "shard"))
    for i, (bucket, tier, strategy) in enumerate(layouts):
        capacity = transport.capacity_tiers(bucket * MAX_M)[tier]
        capacity_reqs = transport.capacity_tiers(bucket)[tier]
        step = Step(transport, device, torch.float32, bucket, capacity, capacity_reqs,
                    use_out=kind == "nccl" or i % 2 == 1, strategy=strategy)
        graph = capture(step, pool)
        pool = graph.pool() if pool is None else pool
        steps.append(step)
        graphs.append(graph)
    torch.cuda.synchronize(device)

    full = torch.empty(MAX_ROWS, TP * VOCAB_SHARD, dtype=torch.float32, device=device)
    bad_graph = torch.zeros((), dtype=torch.int64, device=device)
    bad_eager = torch.zeros((), dtype=torch.int64, device=device)
    for replay in range(num_replays):
        which = int(rng.integers(len(steps)))  # identical on every rank (same seed)
        step = steps[which]
        batch = random_fitting_batch(rng, step)
        arrays = plan_arrays(batch, rank, step.capacity_reqs)
        write_plan(step.plan, arrays)
        if replay % 50 == 0:
            fill_logits(step, full, rank, gen)
        else:
            step.logits.copy_(full[:, rank * VOCAB_SHARD:(rank + 1) * VOCAB_SHARD])
        graphs[which].replay()
        n = batch[0].shape[0]
        bad_graph += mismatches(step, step.outputs, arrays, full, n)
        if replay % 100 == 0:  # the same plan eagerly must give the same bytes
            sizes = expected_sizes(step, arrays, n)
            graph_out = {k: v.clone() for k, v in step.outputs.items()}
            eager_out = step()
            bad_eager += sum((graph_out[k][:sizes[k]] != eager_out[k][:sizes[k]]).sum()
                             for k in graph_out)
    transport.barrier()
    torch.cuda.synchronize(device)
    return {"graph": int(bad_graph), "eager": int(bad_eager)}


@pytest.mark.parametrize("kind", ["nccl", "p2p"])
def test_graph_replays_random_plans(kind):
    results = spawn(check_graphs, TP, kind, 5, 2000, backend="nccl", timeout_s=580)
    assert results == [{"graph": 0, "eager": 0}] * TP
