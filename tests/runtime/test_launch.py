"""`runtime.launch`: the compilation key the CPU tests count Triton binaries with, the
interpreter's launches, and the parameter lists of the package's kernels and functions."""

import ast
import warnings
from pathlib import Path

import pytest

import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import (Launch, bound, bound_arguments, compiles_kernels,
                                       deferred_launches, launch, specialization_key)

PACKAGE = Path(__file__).resolve().parents[2] / "graphshard"
# The finish kernel has the most: the scan's inputs, its records and drafts, seven sizes,
# whether it is launched as a programmatic dependent, and the tiles a step of its row counts.
MAX_PARAMETERS = 22


@triton.jit(do_not_specialize=["n", "pair"], do_not_specialize_on_alignment=["a_ptr", "pair"])
def _probe_kernel(a_ptr, b_ptr, n, pair, K: tl.constexpr):
    tl.store(b_ptr, tl.load(a_ptr) + n + K + tl.load(pair[0]) + pair[1])


@triton.jit
def _masked_difference_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, BLOCK))
    m = tl.max(x, axis=0)
    # A lane of -inf under a maximum of -inf computes -inf - -inf, dropped by the where.
    tl.store(out_ptr + tl.arange(0, BLOCK), tl.where(x > float("-inf"), x - m, 0.0))


def _key(a, b, n, pair, k=1, **options):
    return specialization_key(_probe_kernel, (a, b, n, pair), dict(K=k, **options))


def test_the_key_follows_triton_specialisation_rules():
    words = torch.zeros(8, dtype=torch.int32)
    aligned, unaligned = words[:4], words[1:5]
    base = _key(aligned, aligned, 3, (aligned, 32))
    # Parameters marked: an int's value and a pointer's alignment do not matter.
    assert _key(unaligned, aligned, 1, (aligned, 32)) == base
    # Unmarked: a pointer's alignment matters; constexprs and launch options by value.
    assert _key(aligned, unaligned, 3, (aligned, 32)) != base
    assert _key(aligned, aligned, 3, (aligned, 32), k=2) != base
    assert _key(aligned, aligned, 3, (aligned, 32), num_warps=4) != base
    # A tuple's elements are specialised whatever the parameter's options.
    assert _key(aligned, aligned, 3, (unaligned, 32)) != base
    assert _key(aligned, aligned, 3, (aligned, 1)) != base
    assert _key(aligned, aligned, 3, (aligned, 48)) == base
    # An absent optional input (None) is a value of its own.
    assert _key(aligned, aligned, 3, None) != base


def _parameter_counts():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                yield (f"{path.relative_to(PACKAGE.parent)}:{node.name}",
                       len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs))


def test_no_kernel_or_function_takes_more_than_twenty_two_parameters():
    counts = dict(_parameter_counts())
    assert len(counts) > 100  # the scan found the package
    assert {name: n for name, n in counts.items() if n > MAX_PARAMETERS} == {}


@pytest.mark.skipif(compiles_kernels(_masked_difference_kernel),
                    reason="kernels are compiled here, not interpreted (TRITON_INTERPRET=1)")
def test_interpreted_launches_compute_ieee_results_without_numpy_warnings():
    """A GPU computes -inf - -inf = NaN in a masked lane silently; the interpreter's NumPy would
    warn on every such launch (the demo and the example printed them), unless `launch` runs it."""
    x = torch.full((16,), float("-inf"))
    out = torch.ones(16)
    with pytest.warns(RuntimeWarning):  # the bare interpreted launch warns
        _masked_difference_kernel[(1,)](x, out, BLOCK=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launch(_masked_difference_kernel, (1,), x, out, BLOCK=16)
    assert torch.equal(out, torch.zeros(16))


def _defaults(a_ptr, b_ptr, n, pair=None, K: tl.constexpr = 3):
    pass


class _Variant:
    """A compiled variant as `bound` uses it: indexed by a grid, its runner called with every
    parameter's value."""

    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *values: self.calls.append(("direct", grid, values))


def _compiled_kernel(monkeypatch, calls, variant=True, device=(0,)):
    """A `JITFunction` whose full launch records its call and returns a `_Variant` (or None);
    the current CUDA device is `device[0]`."""
    kernel = triton.runtime.jit.JITFunction(_defaults)

    def run(*args, grid, warmup, **kwargs):
        calls.append(("full", grid, args, kwargs))
        return _Variant(calls) if variant else None

    monkeypatch.setattr(kernel, "run", run, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    return kernel


def test_bound_launches_later_calls_through_the_first_calls_variant(monkeypatch):
    calls = []
    kernel = _compiled_kernel(monkeypatch, calls)
    a, b = torch.zeros(4), torch.ones(4)
    thunk = bound(Launch(kernel, (5,), (a, b, 7), dict(K=2, num_warps=4)))
    for _ in range(3):
        thunk()
    assert [c[0] for c in calls] == ["full", "direct", "direct"]
    assert calls[0][1] == (5,) and calls[0][3] == dict(K=2, num_warps=4)
    # Every parameter in order, the default filled in, the launch option left out.
    _, grid, values = calls[1]
    assert grid == (5, 1, 1) and values[2:] == (7, None, 2)
    assert values[0] is a and values[1] is b
    # Inside deferred_launches a call is recorded, before and after the first launch.
    fresh = bound(Launch(kernel, (5,), (a, b, 7), {}))
    for thunk_ in (fresh, thunk):
        with deferred_launches() as held:
            thunk_()
        assert len(held) == 1 and held[0].args == (a, b, 7)
    assert len(calls) == 3
    fresh()
    assert calls[-1][0] == "full"


def test_bound_takes_the_full_launch_without_a_variant_or_on_another_device(monkeypatch):
    calls = []
    kernel = _compiled_kernel(monkeypatch, calls, variant=False)
    thunk = bound(Launch(kernel, (1,), (torch.zeros(1), torch.zeros(1), 1), {}))
    thunk(), thunk()
    assert [c[0] for c in calls] == ["full", "full"]
    calls.clear()
    device = [0]
    kernel = _compiled_kernel(monkeypatch, calls, device=device)
    thunk = bound(Launch(kernel, (1,), (torch.zeros(1), torch.zeros(1), 1), {}))
    thunk()
    device[0] = 1
    thunk()
    assert [c[0] for c in calls] == ["full", "full"]


def test_bound_arguments_refuses_what_the_kernel_cannot_bind():
    kernel = triton.runtime.jit.JITFunction(_defaults)
    with pytest.raises(TypeError, match="missing"):
        bound_arguments(kernel, (torch.zeros(1),), {})
    with pytest.raises(TypeError, match="positional"):
        bound_arguments(kernel, (1, 2, 3, 4, 5, 6), {})


def test_bound_interpreted_launches_run_every_call():
    x = torch.zeros(4)
    thunk = bound(Launch(_masked_difference_kernel, (1,), (torch.arange(4.0), x), dict(BLOCK=4)))
    assert not compiles_kernels(_masked_difference_kernel)
    thunk()
    assert torch.equal(x, torch.arange(4.0) - 3)
    x.zero_()
    thunk()
    assert torch.equal(x, torch.arange(4.0) - 3)
