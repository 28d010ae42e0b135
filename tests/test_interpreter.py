"""The suite's interpreter shortcuts (tests/interpreter.py) against the interpreter's own code."""

import inspect
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tests.interpreter import patch_builtins_once, use_numpy_xor_sum

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="the code it replaces is the interpreter's")


@triton.jit
def _sort_and_xor_kernel(x_ptr, sorted_ptr, xor_ptr, N: tl.constexpr, GROUP: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)  # [N]
    tl.store(sorted_ptr + offs, tl.sort(x, descending=True))
    bits = x.to(tl.int32, bitcast=True)
    groups = tl.reshape(bits, [N // GROUP, GROUP])
    tl.store(xor_ptr + tl.arange(0, N // GROUP), tl.xor_sum(groups, axis=1))
    tl.store(xor_ptr + N // GROUP, tl.xor_sum(bits, axis=0))
    tl.store(xor_ptr + N // GROUP + 1 + tl.arange(0, GROUP), tl.xor_sum(groups, axis=0))


def _run(x: torch.Tensor, group: int):
    n = x.numel()
    out_sorted = torch.empty_like(x)
    out_xor = torch.empty(n // group + 1 + group, dtype=torch.int32)
    _sort_and_xor_kernel[(1,)](x, out_sorted, out_xor, N=n, GROUP=group)
    return out_sorted, out_xor


@pytest.mark.parametrize("values", ["random", "ties", "specials"])
def test_numpy_xor_sum_equals_the_interpreters(values, monkeypatch):
    if not use_numpy_xor_sum():
        pytest.skip("this Triton's interpreter lacks the internals the faster reduction replaces")
    from triton.runtime.interpreter import ReduceOps  # present: use_numpy_xor_sum found it

    rs = np.random.default_rng(sum(map(ord, values)))
    x = rs.standard_normal(256).astype(np.float32)
    if values == "ties":
        x = rs.choice(np.float32([-1.5, 0.0, 2.0]), 256)
    elif values == "specials":
        x[rs.choice(256, 12, replace=False)] = [np.inf, -np.inf, -0.0, 0.0] * 3
    x = torch.from_numpy(x)
    fast = _run(x, 8)
    monkeypatch.setattr(ReduceOps, "apply_impl", ReduceOps.apply_impl.generic)
    slow = _run(x, 8)
    bits = x.numpy().view(np.int32)
    assert torch.equal(fast[0].view(torch.int32), slow[0].view(torch.int32))
    assert torch.equal(fast[0], torch.sort(x, descending=True).values)
    assert torch.equal(fast[1], slow[1])
    expected = np.concatenate([np.bitwise_xor.reduce(bits.reshape(32, 8), axis=1),
                               [np.bitwise_xor.reduce(bits)],
                               np.bitwise_xor.reduce(bits.reshape(32, 8), axis=0)])
    assert np.array_equal(fast[1].numpy(), expected)


@triton.jit
def _scaled(x, scale):
    return tl.maximum(x * scale, -x).to(tl.float32)


@triton.jit
def _helpers_kernel(x_ptr, out_ptr, N: tl.constexpr, ROUNDS: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)  # [N]
    acc = tl.zeros([N], dtype=tl.float32)
    for i in tl.static_range(ROUNDS):
        acc += _scaled(x, i + 1.0)
    tl.store(out_ptr + offs, tl.cumsum(acc, axis=0) + tl.sum(tl.exp(x), axis=0))


def test_builtins_patched_once_per_launch_give_the_same_results(monkeypatch):
    if not patch_builtins_once():
        pytest.skip("this Triton's interpreter lacks the internals the shortcut wraps")
    from triton.runtime import interpreter

    x = torch.from_numpy(np.random.default_rng(7).standard_normal(64).astype(np.float32))
    calls = []
    counted = inspect.getmembers
    monkeypatch.setattr(interpreter.inspect, "getmembers",
                        lambda *a, **k: calls.append(1) or counted(*a, **k))

    def run():
        out = torch.empty_like(x)
        _helpers_kernel[(2,)](x, out, N=64, ROUNDS=8)
        return out

    calls.clear()
    fast, fast_calls = run(), len(calls)
    monkeypatch.setattr(interpreter, "_patch_builtin", interpreter._patch_builtin.generic)
    calls.clear()
    slow, slow_calls = run(), len(calls)
    assert torch.equal(fast, slow)
    # Only the launch lists the namespaces; without the shortcut every helper call (8 per
    # program) lists them all again.
    assert fast_calls < slow_calls / 4, (fast_calls, slow_calls)
    # The launch swapped the builtins back.
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)
