"""Emulated graph backend (the CPU checker) and the bucket graph manager."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

from graphshard.graphs import (
    BatchTooLargeError,
    EmulatedGraphBackend,
    GraphManager,
    GraphSafetyError,
    build_bucket_table,
    make_backend,
)
from graphshard.runtime.launch import launch

MAX_ROWS = 16


@pytest.fixture
def buffers():
    torch.manual_seed(0)
    return {
        "x": torch.randn(MAX_ROWS),
        "n": torch.tensor([5], dtype=torch.int32),  # device-resident count
        "out": torch.zeros(MAX_ROWS),
    }


def _backend(buffers) -> EmulatedGraphBackend:
    backend = EmulatedGraphBackend()
    backend.register_static_buffers(buffers)
    return backend


def _capture_and_replay(buffers, step, replays=3, between=None):
    backend = _backend(buffers)
    backend.capture(0, step)
    for i in range(replays):
        if between is not None:
            between(i)
        backend.replay(0)
    return backend


def _safe_step(b, rows=MAX_ROWS):
    def step():
        valid = torch.arange(rows) < b["n"]
        b["out"][:rows].copy_(torch.where(valid, b["x"][:rows] * 2 + 1, 0.0))
    return step


# ------------------------------------------------------------------------------------------------
# Host syncs and data-dependent shapes are refused at the op that does them


UNSAFE_STEPS = {
    "item": (lambda b: b["out"].fill_(b["n"].item()), "torch.Tensor.item"),
    "python_if": (lambda b: b["out"].zero_() if b["x"].sum() > 0 else None, "torch.Tensor.__bool__"),
    "tolist": (lambda b: b["out"][: len(b["n"].tolist())].zero_(), "torch.Tensor.tolist"),
    "nonzero": (lambda b: b["out"].index_fill_(0, torch.nonzero(b["x"] > 0).flatten(), 0.0), "torch.nonzero"),
    "nonzero_method": (lambda b: (b["x"] > 0).nonzero(), "torch.Tensor.nonzero"),
    "int": (lambda b: b["out"][: int(b["n"][0])].zero_(), "torch.Tensor.__int__"),
    "float": (lambda b: b["out"].fill_(float(b["x"][0])), "torch.Tensor.__float__"),
    "tensor_slice_bound": (lambda b: b["out"][: b["n"][0]].zero_(), "torch.Tensor.__getitem__"),
    "range_of_tensor": (lambda b: [b["out"][i].zero_() for i in range(b["n"][0])], "torch.Tensor.__index__"),
    "bool_mask_index": (lambda b: b["x"][b["x"] > 0].sum(), "torch.Tensor.__getitem__"),
    "bool_mask_setitem": (lambda b: b["out"].__setitem__(b["x"] > 0, 1.0), "torch.Tensor.__setitem__"),
    "where_one_arg": (lambda b: torch.where(b["x"] > 0), "torch.where"),
    "masked_select": (lambda b: torch.masked_select(b["x"], b["x"] > 0), "torch.masked_select"),
    "unique": (lambda b: torch.unique(b["n"]), "torch.functional.unique"),
    "repeat_interleave": (lambda b: torch.repeat_interleave(b["x"], b["n"].long().repeat(MAX_ROWS)),
                          "torch.repeat_interleave"),
    "cpu": (lambda b: b["x"].cpu(), "torch.Tensor.cpu"),
    "numpy": (lambda b: b["x"].numpy(), "torch.Tensor.numpy"),
    "equal": (lambda b: torch.equal(b["x"], b["out"]), "torch.equal"),
    "size_from_tensor": (lambda b: torch.zeros(b["n"][0]), "torch.zeros"),
    "narrow_by_tensor": (lambda b: b["x"].narrow(0, 0, b["n"][0]), "torch.Tensor.narrow"),
    "host_tensor": (lambda b: b["out"].add_(torch.tensor([1.0] * MAX_ROWS)), "torch.tensor"),
    "one_hot": (lambda b: torch.nn.functional.one_hot(b["n"].long()), "torch.nn.functional.one_hot"),
    "print": (lambda b: f"{b['x'][0]}", "torch.Tensor.__format__"),
}


@pytest.mark.parametrize("case", sorted(UNSAFE_STEPS))
def test_unsafe_op_refused_at_capture(buffers, case):
    body, op_name = UNSAFE_STEPS[case]
    backend = _backend(buffers)
    with pytest.raises(GraphSafetyError, match=op_name.replace(".", r"\.") + " inside a graph-captured step"):
        backend.capture(0, lambda: body(buffers))
    with pytest.raises(KeyError, match=r"no graph captured for key 0; captured: \[\]"):
        backend.replay(0)


def test_unsafe_op_refused_at_warmup(buffers):
    backend = _backend(buffers)
    with pytest.raises(GraphSafetyError, match=r"torch\.Tensor\.item"):
        backend.warmup(lambda: buffers["n"].item(), iters=1)


def test_same_ops_are_fine_outside_the_step(buffers):
    backend = _backend(buffers)
    backend.capture(0, _safe_step(buffers))
    assert buffers["n"].item() == 5
    assert torch.nonzero(buffers["x"] > 100).numel() == 0


def test_fixed_size_alternatives_pass(buffers):
    def step():
        idx = torch.nonzero_static(buffers["x"] > 0, size=MAX_ROWS, fill_value=0).flatten()
        buffers["out"].copy_(buffers["x"].masked_fill(buffers["x"] <= 0, 0.0))
        buffers["out"][:4].add_(idx[:4].float())
        reps = torch.repeat_interleave(buffers["x"][:2], buffers["n"].long().expand(2), output_size=2 * 5)
        buffers["out"][:10].add_(reps)
        buffers["out"].add_(buffers["x"].to("cpu").to(torch.float32))  # no-op moves on a CPU run
        torch.topk(buffers["x"], 3, out=(top_values, top_indices))
        buffers["out"][:3].add_(top_values)

    top_values, top_indices = torch.zeros(3), torch.zeros(3, dtype=torch.int64)
    _capture_and_replay(buffers, step, replays=3)


# ------------------------------------------------------------------------------------------------
# Host state that changes between replays: a CUDA graph would have frozen it


def test_shape_change_between_capture_and_replay(buffers):
    state = {"rows": 4}

    def step():
        buffers["out"][: state["rows"]].copy_(buffers["x"][: state["rows"]])

    backend = _backend(buffers)
    backend.capture(0, step)
    backend.replay(0)
    state["rows"] = 6
    with pytest.raises(GraphSafetyError, match=r"op #0 \(torch\.Tensor\.__getitem__\), argument\[1\]: "
                                               r"captured slice\(None, 4, None\), replayed slice\(None, 6, None\)"):
        backend.replay(0)


def test_host_scalar_change_between_replays(buffers):
    state = {"scale": 2.0}

    def step():
        buffers["out"].copy_(buffers["x"] * state["scale"])

    def bump(i):
        state["scale"] = 2.0 if i < 2 else 3.0

    with pytest.raises(GraphSafetyError, match=r"torch\.Tensor\.mul\), argument\[1\]: captured 2\.0, replayed 3\.0"):
        _capture_and_replay(buffers, step, replays=4, between=bump)


def test_keyword_argument_change_between_replays(buffers):
    state = {"dim": 0}

    def step():
        torch.cumsum(buffers["x"], dim=state["dim"], out=buffers["out"])

    backend = _backend(buffers)
    backend.capture(0, step)
    state["dim"] = -1
    with pytest.raises(GraphSafetyError, match=r"keyword argument 'dim': captured 0, replayed -1"):
        backend.replay(0)


def test_reallocated_input_between_replays(buffers):
    state = {"weights": torch.ones(MAX_ROWS)}

    def step():
        buffers["out"].copy_(buffers["x"] * state["weights"])

    backend = _backend(buffers)
    backend.capture(0, step)
    backend.replay(0)
    state["weights"] = torch.full((MAX_ROWS,), 2.0)  # a graph would still read the old tensor
    with pytest.raises(GraphSafetyError, match="unregistered tensor at address"):
        backend.replay(0)


def test_host_branch_change_between_replays(buffers):
    state = {"extra": False}

    def step():
        buffers["out"].copy_(buffers["x"])
        if state["extra"]:
            buffers["out"].mul_(2)

    backend = _backend(buffers)
    backend.capture(0, step)
    state["extra"] = True
    with pytest.raises(GraphSafetyError, match="replay runs more ops than the capture"):
        backend.replay(0)
    backend2 = _backend(buffers)
    backend2.capture(0, step)
    state["extra"] = False
    with pytest.raises(GraphSafetyError, match=r"replay ran fewer ops than the capture: stopped before op #1 \(torch\.Tensor\.mul_\)"):
        backend2.replay(0)


def test_divergent_op_between_replays(buffers):
    state = {"op": torch.Tensor.add_}

    def step():
        buffers["out"].copy_(buffers["x"])
        state["op"](buffers["out"], 1.0)

    backend = _backend(buffers)
    backend.capture(0, step)
    state["op"] = torch.Tensor.sub_
    with pytest.raises(GraphSafetyError, match=r"captured torch\.Tensor\.add_, replayed torch\.Tensor\.sub_"):
        backend.replay(0)


# ------------------------------------------------------------------------------------------------
# Outputs must land in static buffers


def test_returned_fresh_allocation_refused(buffers):
    backend = _backend(buffers)
    with pytest.raises(GraphSafetyError, match=r"step output \(shape \(16,\).*fresh allocation made inside the step"):
        backend.capture(0, lambda: buffers["x"] * 2)


def test_returned_unregistered_tensor_refused(buffers):
    stray = torch.zeros(MAX_ROWS)

    def step():
        stray.copy_(buffers["x"])
        return {"result": stray}

    backend = _backend(buffers)
    with pytest.raises(GraphSafetyError, match=r"step output\['result'\].*never registered as a static buffer"):
        backend.capture(0, step)


def test_returned_views_of_static_buffers_pass(buffers):
    def step():
        _safe_step(buffers)()
        return buffers["out"][:8], {"n": buffers["n"]}

    backend = _backend(buffers)
    out = backend.capture(0, step)
    assert out[0].data_ptr() == buffers["out"].data_ptr()
    replayed = backend.replay(0)
    assert replayed[1]["n"] is buffers["n"]


def test_returned_host_value_must_not_change(buffers):
    state = {"count": 1}

    def step():
        buffers["out"].copy_(buffers["x"])
        return state["count"]

    backend = _backend(buffers)
    backend.capture(0, step)
    backend.replay(0)
    state["count"] = 2
    with pytest.raises(GraphSafetyError, match="returned different non-tensor values"):
        backend.replay(0)


# ------------------------------------------------------------------------------------------------
# A correct step passes for many replays and equals eager


def test_correct_step_many_replays_equals_eager(buffers):
    backend = _backend(buffers)
    step = _safe_step(buffers)
    backend.warmup(step, iters=2)
    backend.capture(0, step)
    gen = torch.Generator().manual_seed(1)
    for i in range(300):
        n = i % (MAX_ROWS + 1)
        buffers["x"].copy_(torch.randn(MAX_ROWS, generator=gen))
        buffers["n"].fill_(n)
        backend.replay(0)
        expected = torch.zeros(MAX_ROWS)
        expected[:n] = buffers["x"][:n] * 2 + 1
        torch.testing.assert_close(buffers["out"], expected, rtol=0, atol=0)
    assert backend.graph(0).num_replays == 300


@triton.jit
def _double_kernel(x_ptr, out_ptr, n_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    n = tl.load(n_ptr)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x * 2, mask=offs < n)


def test_triton_launch_is_invisible_to_the_checker(buffers):
    def step():
        buffers["out"].zero_()
        launch(_double_kernel, (1,), buffers["x"], buffers["out"], buffers["n"], BLOCK=MAX_ROWS)

    backend = _backend(buffers)
    backend.capture(0, step)
    buffers["n"].fill_(7)
    backend.replay(0)
    expected = torch.zeros(MAX_ROWS)
    expected[:7] = buffers["x"][:7] * 2
    torch.testing.assert_close(buffers["out"], expected)


def test_gloo_collective_inside_step_is_allowed(buffers, tmp_path):
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        gathered = torch.zeros(MAX_ROWS)

        def step():
            staged = buffers["x"] + 1  # a temporary made inside the step feeds the collective
            dist.all_reduce(staged)
            gathered.copy_(staged)
            buffers["out"].copy_(gathered)

        backend = _backend(buffers)
        backend.register_static("gathered", gathered)
        backend.capture(0, step)
        for _ in range(3):
            backend.replay(0)
        torch.testing.assert_close(buffers["out"], buffers["x"] + 1)
    finally:
        dist.destroy_process_group()


def test_static_buffer_name_conflict(buffers):
    backend = _backend(buffers)
    backend.register_static("x", buffers["x"])  # same tensor again is fine
    with pytest.raises(ValueError, match="already registered"):
        backend.register_static("x", torch.zeros(3))
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        backend.register_static("y", [1, 2])


def test_backend_keys_and_errors(buffers):
    backend = _backend(buffers)
    backend.capture(4, _safe_step(buffers, 4))
    with pytest.raises(ValueError, match="already captured"):
        backend.capture(4, _safe_step(buffers, 4))
    with pytest.raises(KeyError, match="no graph captured for key 8"):
        backend.replay(8)
    assert backend.memory_bytes() is None
    assert isinstance(make_backend("emulated"), EmulatedGraphBackend)
    assert isinstance(make_backend("auto", "cpu"), EmulatedGraphBackend)
    with pytest.raises(ValueError, match="graph backend must be one of"):
        make_backend("tpu")


# ------------------------------------------------------------------------------------------------
# GraphManager

BUCKETS = (1, 2, 4, 8, 16, 24)


def _manager(backend=None, **kw) -> GraphManager:
    return GraphManager(backend or EmulatedGraphBackend(), BUCKETS, **kw)


def test_bucket_for_edges():
    m = _manager()
    assert m.bucket_for(0) == 1
    for i, b in enumerate(BUCKETS):
        assert m.bucket_for(b) == b
        assert m.bucket_for(b + 1) == (BUCKETS[i + 1] if i + 1 < len(BUCKETS) else None)
        prev = BUCKETS[i - 1] if i else 0
        assert m.bucket_for(prev + 1) == b
    assert m.bucket_for(25) is None
    assert m.bucket_for(10_000) is None
    with pytest.raises(ValueError, match=">= 0"):
        m.bucket_for(-1)


def test_bucket_table_matches_brute_force():
    rng = random.Random(0)
    for _ in range(30):
        buckets = sorted(rng.sample(range(1, 80), rng.randint(1, 8)))
        table = build_bucket_table(buckets)
        assert len(table) == buckets[-1] + 1
        m = GraphManager(EmulatedGraphBackend(), buckets)
        for n in range(buckets[-1] + 3):
            expected = min((b for b in buckets if b >= n), default=None)
            assert m.bucket_for(n) == expected


@pytest.mark.parametrize("bad", [(), (0, 2), (4, 2), (2, 2), (1.5,)])
def test_manager_rejects_bad_buckets(bad):
    with pytest.raises(ValueError):
        GraphManager(EmulatedGraphBackend(), bad)


class RecordingBackend:
    name = "recording"

    def __init__(self, events):
        self.events = events

    def warmup(self, fn, iters=1):
        for _ in range(iters):
            self.events.append(("warmup", fn()))

    def capture(self, key, fn):
        self.events.append(("capture", fn()))

    def replay(self, key):
        self.events.append(("replay", key))

    def memory_bytes(self):
        return 123


def test_capture_order_largest_first_with_barriers_between_keys():
    events = []
    m = _manager(RecordingBackend(events), barrier=lambda: events.append(("barrier", None)), warmup_iters=2)
    m.capture(lambda key: (lambda: key))
    expected = []
    for i, key in enumerate(sorted(BUCKETS, reverse=True)):
        if i:
            expected.append(("barrier", None))
        expected += [("warmup", key), ("warmup", key), ("capture", key)]
    assert events == expected
    assert m.keys == sorted(BUCKETS, reverse=True)
    assert m.stats().graph_memory_bytes == 123


def test_capture_tuple_keys_largest_first():
    events = []
    m = _manager(RecordingBackend(events), barrier=lambda: events.append(("barrier", None)), warmup_iters=1)
    keys = [(8, 1), (24, 0), (8, 0), (24, 2), (1, 0)]
    m.capture(lambda key: (lambda: key), keys=keys)
    assert [e[1] for e in events if e[0] == "capture"] == [(24, 2), (24, 0), (8, 1), (8, 0), (1, 0)]
    assert [e[0] for e in events].count("barrier") == len(keys) - 1
    with pytest.raises(ValueError, match="does not name one of the buckets"):
        m.capture(lambda key: (lambda: key), keys=[(3, 0)])
    with pytest.raises(ValueError, match="already captured"):
        m.capture(lambda key: (lambda: key), keys=[(8, 1)])
    with pytest.raises(ValueError, match="unique"):
        _manager(RecordingBackend([])).capture(lambda key: (lambda: key), keys=[2, 2])


def test_manager_replays_the_right_key():
    out = torch.zeros(1)
    backend = EmulatedGraphBackend()
    backend.register_static("out", out)
    m = _manager(backend)
    m.capture(lambda key: (lambda: out.fill_(float(key))))
    for n in (0, 1, 3, 4, 5, 17, 24):
        key = m.bucket_for(n)
        m.replay(key)
        assert out.item() == key
    stats = m.stats()
    assert stats.replays == {24: 2, 16: 0, 8: 1, 4: 2, 2: 0, 1: 2}
    assert set(stats.capture_s) == set(BUCKETS)
    assert stats.capture_total_s == pytest.approx(sum(stats.capture_s.values()))
    assert stats.graph_memory_bytes is None
    with pytest.raises(KeyError, match="no graph captured for key 3"):
        m.replay(3)


def test_manager_graphs_equal_eager_over_random_n():
    gen = torch.Generator().manual_seed(2)
    x, n_dev, out = torch.randn(BUCKETS[-1]), torch.zeros(1, dtype=torch.int64), torch.zeros(BUCKETS[-1])
    backend = EmulatedGraphBackend()
    backend.register_static_buffers({"x": x, "n": n_dev, "out": out})

    def step_for(bucket):
        def step():
            rows = torch.arange(bucket)
            out[:bucket].copy_(torch.where(rows < n_dev, torch.exp(x[:bucket]) - rows, -1.0))
        return step

    m = _manager(backend)
    m.capture(step_for)
    for n in torch.randint(0, BUCKETS[-1] + 1, (60,), generator=gen).tolist():
        x.copy_(torch.randn(BUCKETS[-1], generator=gen))
        n_dev.fill_(n)
        m.replay(m.bucket_for(n))
        expected = torch.exp(x[:n]) - torch.arange(n)
        torch.testing.assert_close(out[:n], expected, rtol=0, atol=0)
        assert (out[n:m.bucket_for(n)] == -1).all()


def test_eager_fallback_counts():
    m = _manager()
    assert m.run_eager(lambda: 7, n=30) == 7
    m.run_eager(lambda: None)
    assert m.stats().eager_fallbacks == 2
    m.check_fits(10_000)  # eager fallback: any size is allowed


def test_fallback_error_raises_without_running_the_step():
    m = _manager(fallback="error")
    ran = []
    with pytest.raises(BatchTooLargeError, match=r"batch of 30 requests exceeds the largest captured bucket \(24\)"):
        m.run_eager(lambda: ran.append(1), n=30)
    assert ran == []
    assert m.stats().eager_fallbacks == 0
    m.check_fits(24)
    with pytest.raises(BatchTooLargeError):
        m.check_fits(25)
    with pytest.raises(ValueError, match="fallback must be one of"):
        _manager(fallback="retry")


def test_manager_capture_surfaces_unsafe_step():
    m = _manager()
    with pytest.raises(GraphSafetyError, match=r"torch\.Tensor\.tolist"):
        m.capture(lambda key: (lambda: torch.zeros(key).tolist()))
