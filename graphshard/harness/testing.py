"""Test your own step code for CUDA-graph safety on a CPU-only machine.

A step is a no-argument callable that reads static input buffers and writes static output buffers.
Inside a CUDA graph it must never sync with the host, never change shape or scalar arguments
between replays, and leave its results in the static buffers. These helpers run a step on the
emulated graph backend, which refuses each of those mistakes with a `GraphSafetyError` naming
the offending op, and compare graph replays against plain eager runs.

Example::

    import torch
    from graphshard.harness.testing import assert_replay_equals_eager, check_graph_safe

    def step(inputs, outputs):
        # `n` stays on the device: mask padding rows instead of slicing by a host int.
        rows = torch.arange(inputs["x"].shape[0])
        valid = rows < inputs["n"]
        outputs["y"].copy_(torch.where(valid, inputs["x"] * 2, 0.0))

    static_in = {"x": torch.zeros(8), "n": torch.zeros((), dtype=torch.int64)}
    static_out = {"y": torch.zeros(8)}

    def make_inputs(i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "n": torch.tensor(i % 9)}

    check_graph_safe(lambda: step(static_in, static_out), [*static_in.values(), *static_out.values()])
    assert_replay_equals_eager(make_inputs, step, static_in, static_out, num_sets=16)

Triton kernels launched through `graphshard.runtime.launch.launch` and torch.distributed collectives are
not inspected (they are not torch functions); their inputs and outputs still are.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch

from graphshard.graphs.emulated import EmulatedGraph, GraphSafetyError, StaticBuffers

__all__ = ["GraphSafetyError", "assert_replay_equals_eager", "check_graph_safe"]

Tensors = Mapping[str, torch.Tensor]


def _statics(buffers: Mapping[str, torch.Tensor] | Iterable[torch.Tensor]) -> StaticBuffers:
    statics = StaticBuffers()
    items = buffers.items() if isinstance(buffers, Mapping) else (
        (f"buffer{i}", t) for i, t in enumerate(buffers))
    for name, tensor in items:
        statics.add(name, tensor)
    return statics


def check_graph_safe(fn: Callable[[], Any], static_buffers: Mapping[str, torch.Tensor] | Iterable[torch.Tensor],
                     replays: int = 8, before_replay: Callable[[int], Any] | None = None) -> EmulatedGraph:
    """Capture `fn` on the emulated backend and replay it `replays` times.

    `static_buffers` are the tensors that outlive the step (inputs, outputs, state tables);
    `before_replay(i)`, if given, runs before replay `i`, e.g. to write new inputs into them.
    Raises GraphSafetyError on the first unsafe op; returns the graph (its `trace` lists the ops).
    """
    graph = EmulatedGraph(fn, _statics(static_buffers))
    graph.capture()
    for i in range(replays):
        if before_replay is not None:
            before_replay(i)
        graph.replay()
    return graph


def _fill(static: Tensors, values: Tensors, which: int):
    missing = set(static) - set(values)
    if missing:
        raise ValueError(f"make_inputs({which}) did not produce input(s) {sorted(missing)}")
    for name, buf in static.items():
        src = values[name]
        if src.shape != buf.shape:
            raise ValueError(f"make_inputs({which})[{name!r}] has shape {tuple(src.shape)}, "
                             f"the static input has {tuple(buf.shape)}")
        buf.copy_(src)


def assert_replay_equals_eager(make_inputs: Callable[[int], Tensors],
                               step_fn: Callable[[Tensors, Tensors], Any],
                               static_inputs: Tensors, static_outputs: Tensors, *,
                               num_sets: int = 8, extra_static: Tensors | None = None,
                               rtol: float = 0.0, atol: float = 0.0) -> EmulatedGraph:
    """Replay `step_fn` as an emulated graph over several input sets and compare with eager runs.

    `step_fn(inputs, outputs)` reads the tensors in `inputs` and writes the ones in `outputs`.
    The graph is captured once on `static_inputs`/`static_outputs` (filled from `make_inputs(0)`).
    Then, for each `i < num_sets`: `make_inputs(i)` is copied into the static inputs and the graph
    replays, while the same step runs eagerly on fresh tensors (copies of the inputs and of the
    outputs as they were before the replay). Every output must match (exactly by default).
    `extra_static` names other tensors the step reads across replays (weights, state tables);
    the step must not update them, or the graph and the eager run would update them twice.
    """
    if num_sets < 1:
        raise ValueError(f"num_sets must be >= 1, got {num_sets}")
    overlap = set(static_inputs) & set(static_outputs)
    if overlap:
        raise ValueError(f"names used for both inputs and outputs: {sorted(overlap)}")
    buffers = {**(extra_static or {}), **static_inputs, **static_outputs}
    graph = EmulatedGraph(lambda: step_fn(static_inputs, static_outputs), _statics(buffers))
    _fill(static_inputs, make_inputs(0), 0)
    graph.capture()
    for i in range(num_sets):
        inputs = make_inputs(i)
        _fill(static_inputs, inputs, i)
        eager_inputs = {k: v.clone() for k, v in inputs.items()}
        eager_outputs = {k: v.clone() for k, v in static_outputs.items()}
        graph.replay()
        step_fn(eager_inputs, eager_outputs)
        for name, expected in eager_outputs.items():
            try:
                torch.testing.assert_close(static_outputs[name], expected, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as e:
                raise AssertionError(f"input set {i}: output {name!r} differs between graph replay "
                                     f"and eager run:\n{e}") from None
    return graph
