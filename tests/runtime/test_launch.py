"""`runtime.launch`: the compilation key the CPU tests count Triton binaries with, the
interpreter's launches, and the parameter lists of the package's kernels and functions."""

import ast
import warnings
from pathlib import Path

import pytest

import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import compiles_kernels, launch, specialization_key

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
