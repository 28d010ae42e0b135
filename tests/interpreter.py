"""A faster xor reduction for Triton's interpreter, which the CPU suite runs every kernel under.

The interpreter reduces with NumPy for sum, min, max and argmin/argmax, and one element at a
time in Python for any other combine function. `tl.sort` runs an xor reduction in each of its
compare-and-swap stages, so the finish kernel's pool sorts spent ~90 % of an interpreted sampler
call there (15 of 17 s in one adversarial batch of `tests/sample/test_sampler.py`). NumPy's
xor reduction computes the same values; `tests/test_interpreter.py` checks it against the
interpreter's own.
"""

from __future__ import annotations

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
