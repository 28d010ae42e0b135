"""One way to launch a Triton kernel, shared by every launcher in the package, and a way to
compile what a piece of code would launch before it runs.

Kernels run with torch-function handling disabled: under the Triton interpreter a launch moves
tensors through the host, which the emulated graph checker would otherwise report as host syncs
in the step. A compiled kernel on a GPU does no such thing, so nothing is hidden by this.
Interpreted kernels also run with NumPy's floating-point warnings off: the interpreter computes
every lane of an expression with NumPy, masked lanes too (-inf - -inf where a `tl.where` drops
the result), and the kernels rely on IEEE results there, which a GPU produces without a word.

Triton compiles a kernel variant at its first launch, one after another. A vocabulary-sized
sampler variant takes a minute or more of one CPU core (BENCHMARKS.md, "Compile time of the
finish"), and a capture meets several. `deferred_launches` records the launches of a block
instead of running them, and `compile_launches` compiles their distinct variants on threads
(Triton's `AsyncCompileMode`; its compiler passes release the GIL) into the kernels' own
in-memory caches, so the launches that follow find them compiled.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl


class Launch(NamedTuple):
    """One launch as `launch` was asked for it."""

    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict


# Set only inside `deferred_launches`, for the thread (or task) that entered it.
_deferred: ContextVar[list[Launch] | None] = ContextVar("graphshard_deferred_launches", default=None)


def launch(kernel, grid, *args, **kwargs):
    deferred = _deferred.get()
    if deferred is not None:
        deferred.append(Launch(kernel, grid, args, kwargs))
        return None
    if compiles_kernels(kernel):
        with torch._C.DisableTorchFunction():
            return kernel[grid](*args, **kwargs)
    with torch._C.DisableTorchFunction(), np.errstate(all="ignore"):
        return kernel[grid](*args, **kwargs)


@contextmanager
def deferred_launches() -> Iterator[list[Launch]]:
    """Inside the block, `launch` records each launch into the list it yields and runs nothing.
    Only what goes through `launch` is held back: the block's other operations run."""
    if _deferred.get() is not None:
        raise RuntimeError("deferred_launches() is already active")
    launches: list[Launch] = []
    token = _deferred.set(launches)
    try:
        yield launches
    finally:
        _deferred.reset(token)


def recorded(fn: Callable[[], None]) -> Callable[[], None]:
    """`fn`, whose launches its first call records and runs, and whose later calls replay them
    without calling it: for a function whose only device work is `launch` calls, with the same
    arguments every call (static buffers), so that later calls skip its checks and argument
    building (the built-in sampler's: ~105 µs p50 of an eager step's host time in the mixed
    workload's loop on the 2-core CPU machine, against ~12 for the replay's loop). The replays
    go through `bound` launches. Inside `deferred_launches` it calls `fn`, and the block
    records its launches; a first call there keeps them too, so that its first call outside
    (an engine's first step above its buckets, after the compile-ahead recorded it) replays."""
    thunks: list[Callable[[], None]] | None = None

    def call() -> None:
        nonlocal thunks
        outer = _deferred.get()
        if outer is not None:
            start = len(outer)
            fn()
            if thunks is None:
                thunks = [bound(item) for item in outer[start:]]
            return
        if thunks is None:
            with deferred_launches() as first:
                fn()
            thunks = [bound(item) for item in first]
        for thunk in thunks:
            thunk()

    return call


def bound(item: Launch) -> Callable[[], None]:
    """A call that launches `item` as `launch(item.kernel, item.grid, *item.args, **item.kwargs)`
    does, every time, for arguments that stay the same (static buffers). A compiled kernel's
    later calls go straight to the variant its first call launched, its arguments bound once:
    Triton's per-launch binding, specialisation and cache look-up are what an eager step's
    launches cost on the host. Launch hooks (`triton.knobs.runtime.launch_enter_hook`) and the
    current stream are honoured at every call; a call on another device than the first takes
    the full path. Inside `deferred_launches` a call is recorded, as `launch` records it."""
    if not compiles_kernels(item.kernel):
        return lambda: launch(item.kernel, item.grid, *item.args, **item.kwargs)
    direct: Callable[[], None] | None = None

    def call() -> None:
        nonlocal direct
        if _deferred.get() is not None:
            launch(item.kernel, item.grid, *item.args, **item.kwargs)
        elif direct is not None:
            direct()
        else:
            direct = _direct_launch(item, launch(item.kernel, item.grid, *item.args, **item.kwargs))

    return call


def _direct_launch(item: Launch, compiled) -> Callable[[], None]:
    """`item` launched through `compiled` (the variant its full launch returned), or the full
    launch where that variant offers no launcher (`CompiledKernel.__getitem__`)."""
    full = functools.partial(launch, item.kernel, item.grid, *item.args, **item.kwargs)
    if compiled is None or not callable(getattr(compiled, "__getitem__", None)):
        return full
    grid = tuple(item.grid) + (1,) * (3 - len(item.grid))
    runner = compiled[grid]
    values = bound_arguments(item.kernel, item.args, item.kwargs)
    device = torch.cuda.current_device()
    current_device = torch.cuda.current_device

    def direct() -> None:
        if current_device() != device:
            full()
            return
        with torch._C.DisableTorchFunction():
            runner(*values)

    return direct


def bound_arguments(kernel, args: tuple, kwargs: dict) -> tuple:
    """Every parameter's value in the kernel's order, defaults filled in, launch options
    (`num_warps`, ...) left out: what a compiled variant's launcher takes after its grid."""
    names = _signature(kernel)[0]
    params = inspect.signature(kernel.fn).parameters
    values = dict(zip(names, args))
    for name, value in kwargs.items():
        if name in params:
            values[name] = value
    missing = [n for n in names if n not in values and params[n].default is inspect.Parameter.empty]
    if missing or len(args) > len(names):
        raise TypeError(f"{getattr(kernel, '__name__', kernel)}: cannot bind its arguments "
                        f"(missing {missing}, {len(args)} positional of {len(names)})")
    return tuple(values[n] if n in values else params[n].default for n in names)


def compiles_kernels(kernel) -> bool:
    """Whether `kernel` is compiled (a `JITFunction`), not run by the interpreter."""
    return isinstance(kernel, triton.runtime.jit.JITFunction)


def compile_workers() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def distinct_variants(launches: list[Launch]) -> list[Launch]:
    """The first launch of each distinct compiled variant (`specialization_key`) among
    `launches`, in their order; interpreted kernels have no variants and are left out."""
    distinct = {}
    for item in launches:
        if compiles_kernels(item.kernel):
            distinct.setdefault((id(item.kernel), specialization_key(item.kernel, item.args,
                                                                     item.kwargs)), item)
    return list(distinct.values())


def compile_launches(launches: list[Launch], workers: int | None = None) -> int:
    """Compile the variants `launches` need (nothing launches) on up to `workers` threads
    (default: one per core this process may use), for the current device. Returns how many
    distinct variants were missing from the kernels' in-memory caches (each compiled here, or
    loaded from Triton's cache). Interpreted kernels have nothing to compile and are skipped. A
    failed compile raises here, once the others are compiled and in memory."""
    # One launch per variant: a warmup of a variant still compiling repeats its binding and key
    # (~0.4 ms), and a capture records thousands of launches.
    compiled = distinct_variants(launches)
    if not compiled:
        return 0
    workers = max(1, min(len(compiled), workers or compile_workers()))
    # Triton 3.6's AsyncCompileMode stays active in the context that entered it when a compile
    # fails (it resets itself after its wait, not in a `finally`), and every later compile of
    # that thread would then fail: it runs in a copy of the context.
    return contextvars.copy_context().run(_compile_on_pool, compiled, workers)


def _compile_on_pool(compiled: list[Launch], workers: int) -> int:
    pool = ThreadPoolExecutor(workers, thread_name_prefix="graphshard-compile")
    try:
        with torch._C.DisableTorchFunction(), triton.AsyncCompileMode(pool, ignore_errors=True) as mode:
            try:
                # Each `warmup` computes its variant's cache key here, on this thread, in launch
                # order (Triton 3.6's key of a kernel depends on which kernels' keys the process
                # computed before it), and hands only the compile to the pool; a variant already
                # submitted or in memory is not compiled again.
                for item in compiled:
                    item.kernel.warmup(*item.args, grid=item.grid, **item.kwargs)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)  # an interrupt waits for no queue
                raise
    finally:
        pool.shutdown()
    for future in mode.future_kernels.values():
        if not future.future.cancelled() and future.future.exception() is not None:
            raise future.future.exception()
    return len(mode.future_kernels)


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
