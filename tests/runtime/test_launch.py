"""`runtime.launch`: the compilation key the CPU tests count Triton binaries with, and the
parameter lists of the package's kernels and functions."""

import ast
from pathlib import Path

import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import specialization_key

PACKAGE = Path(__file__).resolve().parents[2] / "graphshard"
# The finish kernel has the most: the scan's inputs, its records and drafts, seven sizes and
# whether it is launched as a programmatic dependent.
MAX_PARAMETERS = 21


@triton.jit(do_not_specialize=["n", "pair"], do_not_specialize_on_alignment=["a_ptr", "pair"])
def _probe_kernel(a_ptr, b_ptr, n, pair, K: tl.constexpr):
    tl.store(b_ptr, tl.load(a_ptr) + n + K + tl.load(pair[0]) + pair[1])


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


def test_no_kernel_or_function_takes_more_than_twenty_one_parameters():
    counts = dict(_parameter_counts())
    assert len(counts) > 100  # the scan found the package
    assert {name: n for name, n in counts.items() if n > MAX_PARAMETERS} == {}
