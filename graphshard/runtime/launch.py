"""One way to launch a Triton kernel, shared by every launcher in the package.

Kernels run with torch-function handling disabled: under the Triton interpreter a launch moves
tensors through the host, which the emulated graph checker would otherwise report as host syncs
in the step. A compiled kernel on a GPU does no such thing, so nothing is hidden by this.
"""

from __future__ import annotations

import inspect

import torch
import triton.language as tl


def launch(kernel, grid, *args, **kwargs):
    with torch._C.DisableTorchFunction():
        return kernel[grid](*args, **kwargs)


def _signature(kernel) -> tuple[list[str], set[str], set, set]:
    """(parameter names, constexpr names, do_not_specialize entries, do_not_specialize_on_alignment
    entries) of a jit or interpreted kernel."""
    fn = kernel.fn
    sig = inspect.signature(fn).parameters
    names = list(sig)
    constexprs = {n for n, p in sig.items() if p.annotation is tl.constexpr or p.annotation == "tl.constexpr"}
    return names, constexprs, _option(kernel, "do_not_specialize"), \
        _option(kernel, "do_not_specialize_on_alignment")


def _option(kernel, name: str) -> set:
    value = getattr(kernel, name, None)
    if value is None:  # the interpreter keeps the decorator's arguments instead
        value = (getattr(kernel, "kwargs", None) or {}).get(name) or ()
    return set(value)


def specialization_key(kernel, args: tuple, kwargs: dict) -> tuple:
    """What Triton compiles a separate binary for: constexprs by value, int args equal to 1 or
    divisible by 16 (unless marked do_not_specialize), pointer alignment (unless marked
    do_not_specialize_on_alignment), the elements of a tuple argument alike. Used to count
    compilations where the interpreter compiles nothing."""
    names, constexprs, no_spec, any_alignment = _signature(kernel)
    bound = dict(zip(names, args))
    bound.update(kwargs)
    key = []
    for i, name in enumerate(names):
        if name not in bound:
            continue
        v = bound[name]
        if name in constexprs:
            key.append((name, repr(v)))
        else:
            key.append((name, _arg_key(v, name in no_spec or i in no_spec,
                                       name in any_alignment or i in any_alignment)))
    for name, v in kwargs.items():
        if name not in names:  # launch options: num_warps, num_stages
            key.append((name, repr(v)))
    return tuple(key)


def _arg_key(v, no_spec: bool, any_alignment: bool):
    """One runtime argument's part of the key. Triton specialises a tuple's elements whatever
    the parameter's options."""
    if isinstance(v, tuple):
        return tuple(_arg_key(e, False, False) for e in v)
    if isinstance(v, torch.Tensor):
        return (str(v.dtype), None if any_alignment else v.data_ptr() % 16 == 0)
    if isinstance(v, bool) or not isinstance(v, int):
        return type(v).__name__
    if no_spec:
        return "int"
    return (v == 1, v % 16 == 0)


def check_int32_vector(name: str, t, min_len: int, device: torch.device, *, where: str = "") -> None:
    """A launcher's check of a 1-D int32 index/count argument (contiguous, long enough, on device)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, {where or 'the kernel runs'} on {device}")
    if t.dim() != 1 or (t.numel() > 1 and t.stride(0) != 1) or t.shape[0] < min_len:
        raise ValueError(f"{name} must be a contiguous 1-D tensor of at least {min_len} entries, "
                         f"got shape {tuple(t.shape)} stride {t.stride()}")
