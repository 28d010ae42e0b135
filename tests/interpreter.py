"""Two shortcuts in Triton's interpreter, which the CPU suite runs every kernel under.

A faster xor reduction.

The interpreter reduces with NumPy for sum, min, max and argmin/argmax, and one element at a
time in Python for any other combine function. `tl.sort` runs an xor reduction in each of its
compare-and-swap stages, so the finish kernel's pool sorts spent ~90 % of an interpreted sampler
call there (15 of 17 s in one adversarial batch of `tests/sample/test_sampler.py`). NumPy's
xor reduction computes the same values; `tests/test_interpreter.py` checks it against the
interpreter's own.

Builtins patched once per launch. Before a launch runs its programs, the interpreter swaps every
builtin of `triton.language` (and of `tl.tensor`, `tl.math`, `tl.core`) for a function that
runs it on NumPy, and swaps the originals back afterwards. It also calls that swap on every call
of a `@triton.jit` helper inside the launch, which lists each namespace's members with
`inspect.getmembers` only to find nothing left to swap. The sampler calls helpers thousands of
times per launch: in an interpreted decode loop of `tests/engine`, 38 % of the time went there
(13 of 34 s). A namespace whose builtins are already swapped is now left as it is.
`tests/test_interpreter.py` checks that kernels built from helpers give the same results and
that a launch still swaps the originals back.
"""

from __future__ import annotations

import inspect

import numpy as np


def use_numpy_xor_sum() -> bool:
    """Route the interpreter's xor reductions through NumPy; False (and nothing changed) when
    this Triton lacks the interpreter internals it replaces."""
    try:
        from triton.language import standard
        from triton.runtime.interpreter import ReduceOps
        xor = standard._xor_combine
        generic = ReduceOps.apply_impl
    except (ImportError, AttributeError):
        return False
    if getattr(generic, "numpy_xor_sum", False):
        return True

    def apply_impl(self, input):
        if self.combine_fn is not xor or len(input) != 1:
            return generic(self, input)
        data = input[0].handle.data
        out = np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(out, input[0].dtype)

    apply_impl.numpy_xor_sum = True
    apply_impl.generic = generic
    ReduceOps.apply_impl = apply_impl
    return True


def patch_builtins_once() -> bool:
    """Skip the interpreter's re-patching of a namespace whose builtins are patched already; False
    (and nothing changed) when this Triton lacks the interpreter internals it wraps."""
    try:
        from triton.language.core import is_builtin
        from triton.runtime import interpreter
        generic = interpreter._patch_builtin
    except (ImportError, AttributeError):
        return False
    if getattr(generic, "once", False):
        return True
    # One builtin's name per namespace: the interpreter swaps all of a namespace's builtins in
    # one call and restores them all at the end of the launch, so one tells for the rest.
    sample: dict[int, str] = {}

    def patch_builtin(pkg, builder, scope):
        name = sample.get(id(pkg))
        if name is not None and not is_builtin(getattr(pkg, name)):
            return
        if name is None:
            name = next((n for n, member in inspect.getmembers(pkg) if is_builtin(member)), None)
            if name is not None:
                sample[id(pkg)] = name
        generic(pkg, builder, scope)

    patch_builtin.once = True
    patch_builtin.generic = generic
    interpreter._patch_builtin = patch_builtin
    return True
