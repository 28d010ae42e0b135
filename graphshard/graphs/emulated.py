"""Emulated CUDA graphs for CPU: record a step once, re-run it under a checker on every replay.

A real CUDA graph freezes everything the host decided at capture time: which kernels run, their
shapes, their scalar arguments and the addresses they touch. Code that is fine eagerly can
therefore be silently wrong inside a graph. The emulated backend makes those mistakes loud on a
CPU-only machine. While the step runs, a `TorchFunctionMode` checker

* refuses host syncs (`.item()`, `.tolist()`, Python `if` on a tensor, `.cpu()`, ...) and ops
  whose output shape depends on tensor values (`nonzero`, `unique`, boolean-mask indexing, ...);
* records every op at capture (op, argument shapes/dtypes/addresses, scalar arguments, result
  shapes) and compares each replay against that trace, so host state that changes between
  replays is caught where a CUDA graph would have replayed the stale value;
* checks that every tensor the step returns lives in a registered static buffer.

Triton kernels launched through `graphshard.runtime.launch.launch` and torch.distributed collectives are
not torch functions, so the checker does not see them; that is intended.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode, resolve_name


class GraphSafetyError(RuntimeError):
    """The step does something a captured CUDA graph cannot reproduce on replay."""


_SYNC = "reads tensor values on the host (a device sync; a CUDA graph would replay the value read at capture)"
_SHAPE = "produces an output whose shape depends on tensor values (needs a host sync to size it)"
_HOST_DATA = "builds a tensor from host data (a host-to-device copy frozen into the graph)"

# Op -> why a captured step must not call it.
_REFUSED: dict[Callable, str] = {
    torch.Tensor.item: _SYNC,
    torch.Tensor.tolist: _SYNC,
    torch.Tensor.numpy: _SYNC,
    torch.Tensor.__array__: _SYNC,
    torch.Tensor.__bool__: _SYNC + "; a Python `if`/`and`/`or`/`not`/`assert` on a tensor",
    torch.Tensor.__int__: _SYNC + "; `int(tensor)`",
    torch.Tensor.__float__: _SYNC + "; `float(tensor)`",
    torch.Tensor.__complex__: _SYNC,
    torch.Tensor.__index__: _SYNC + "; a tensor used as a Python int (slice bound, range, size)",
    torch.Tensor.__contains__: _SYNC + "; `x in tensor`",
    torch.Tensor.__repr__: _SYNC + "; printing a tensor",
    torch.Tensor.__format__: _SYNC + "; formatting a tensor",
    torch.Tensor.cpu: "copies a tensor to the host (a device sync)",
    torch.Tensor.pin_memory: "copies a tensor to pinned host memory",
    torch.equal: _SYNC + "; returns a Python bool",
    torch.Tensor.equal: _SYNC + "; returns a Python bool",
    torch.allclose: _SYNC + "; returns a Python bool",
    torch.Tensor.allclose: _SYNC + "; returns a Python bool",
    torch.is_nonzero: _SYNC + "; returns a Python bool",
    torch.Tensor.is_nonzero: _SYNC + "; returns a Python bool",
    torch.nonzero: _SHAPE + "; use a fixed-size mask or torch.nonzero_static",
    torch.Tensor.nonzero: _SHAPE + "; use a fixed-size mask or torch.nonzero_static",
    torch.argwhere: _SHAPE,
    torch.Tensor.argwhere: _SHAPE,
    torch.masked_select: _SHAPE + "; use torch.where with a fixed shape",
    torch.Tensor.masked_select: _SHAPE + "; use torch.where with a fixed shape",
    torch.unique: _SHAPE,
    torch.Tensor.unique: _SHAPE,
    torch.unique_consecutive: _SHAPE,
    torch.Tensor.unique_consecutive: _SHAPE,
    torch.bincount: _SHAPE + " (its length is max(input) + 1)",
    torch.Tensor.bincount: _SHAPE + " (its length is max(input) + 1)",
    torch.tensor: _HOST_DATA,
    torch.Tensor.new_tensor: _HOST_DATA,
}

# Ops whose integer arguments are read on the host: a tensor passed there is synced with `.item()`.
_SIZE_ARGS_AFTER_SELF = {
    torch.Tensor.narrow, torch.narrow, torch.Tensor.view, torch.Tensor.reshape, torch.reshape,
    torch.Tensor.expand, torch.Tensor.repeat, torch.Tensor.new_zeros, torch.Tensor.new_ones,
    torch.Tensor.new_empty, torch.Tensor.new_full, torch.Tensor.resize_, torch.Tensor.split,
    torch.split, torch.Tensor.chunk, torch.chunk, torch.Tensor.tensor_split, torch.tensor_split,
    torch.Tensor.topk, torch.topk, torch.Tensor.kthvalue, torch.kthvalue, torch.Tensor.select,
    torch.select, torch.Tensor.roll, torch.roll, torch.Tensor.unflatten,
}
_SIZE_ARGS_ALL = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.linspace, torch.logspace,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye,
}

# Metadata queries: cheap, never unsafe, and any shape change they reveal shows up in later ops.
_PASSTHROUGH = {
    torch.Tensor.dim, torch.Tensor.size, torch.Tensor.numel, torch.Tensor.stride,
    torch.Tensor.storage_offset, torch.Tensor.is_contiguous, torch.Tensor.data_ptr,
    torch.Tensor.element_size, torch.Tensor.untyped_storage, torch.Tensor.__len__,
    torch.Tensor.is_complex, torch.Tensor.is_floating_point, torch.Tensor.get_device,
}


def _op_name(func) -> str:
    return resolve_name(func) or getattr(func, "__qualname__", None) or repr(func)


def _contains_tensor(obj) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_contains_tensor(o) for o in obj)
    if isinstance(obj, slice):
        return any(isinstance(o, torch.Tensor) for o in (obj.start, obj.stop, obj.step))
    return False


def _index_problem(index) -> str | None:
    """Why an index given to __getitem__/__setitem__ cannot be captured, or None."""
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, torch.Tensor) and part.dtype in (torch.bool, torch.uint8):
            return "boolean-mask indexing " + _SHAPE + "; use torch.where or masked_fill_"
        if isinstance(part, slice) and _contains_tensor(part):
            return _SYNC + "; a tensor used as a slice bound"
        if isinstance(part, list):
            return _HOST_DATA + "; index with a device tensor instead of a Python list"
    return None


def _moves_to_host(args, kwargs) -> bool:
    """`Tensor.to` from a device to the CPU. On a CPU-only run it is a no-op and is let through,
    so that steps may call `.to(self.device)`; `.cpu()` is always refused."""
    if args[0].device.type == "cpu":
        return False
    for t in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(t, torch.device) and t.type == "cpu":
            return True
        if isinstance(t, str) and t.split(":")[0] == "cpu":
            return True
    return False


def _refusal(func, args, kwargs) -> str | None:
    """Why `func(*args, **kwargs)` cannot run inside a captured step, or None."""
    why = _REFUSED.get(func)
    if why is not None:
        return why
    if func is torch.Tensor.__getitem__ or func is torch.Tensor.__setitem__:
        return _index_problem(args[1])
    if func is torch.where and len(args) + len(kwargs) == 1:
        return _SHAPE + "; pass `input` and `other` to torch.where"
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
        if isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None:
            return _SHAPE + "; pass output_size"
    if func is F.one_hot:
        classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
        if classes is None or classes < 0:
            return _SHAPE + "; pass num_classes"
    if func is torch.Tensor.to and _moves_to_host(args, kwargs):
        return "copies a tensor to the host (a device sync)"
    if func in (torch.as_tensor, torch.asarray) and args and not isinstance(args[0], torch.Tensor):
        return _HOST_DATA
    if func in _SIZE_ARGS_AFTER_SELF or func in _SIZE_ARGS_ALL:
        host_args = args[1:] if func in _SIZE_ARGS_AFTER_SELF else args
        host_kwargs = tuple(v for k, v in kwargs.items() if k != "out")
        if _contains_tensor(host_args) or _contains_tensor(host_kwargs):
            return _SYNC + "; a tensor passed where the op takes a host number (size, index, bound, fill value)"
    return None


# ------------------------------------------------------------------------------------------------
# Static buffers


class StaticBuffers:
    """Named tensors that outlive every replay; a step's results must land in these."""

    def __init__(self):
        self._tensors: dict[str, torch.Tensor] = {}
        self._by_storage: dict[int, str] = {}

    def add(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"static buffer {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        old = self._tensors.get(name)
        if old is not None and old is not tensor:
            raise ValueError(f"static buffer {name!r} is already registered with a different tensor")
        self._tensors[name] = tensor
        ptr = tensor.untyped_storage().data_ptr()
        if ptr:
            # Buffers carved from one allocation share a storage: its label names them all (a
            # signature tells them apart by storage offset).
            label = self._by_storage.get(ptr)
            if label is None or name not in label.split("|"):
                self._by_storage[ptr] = name if label is None else f"{label}|{name}"
        return tensor

    def name_of_storage(self, ptr: int) -> str | None:
        return self._by_storage.get(ptr)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __len__(self) -> int:
        return len(self._tensors)

    def items(self):
        return self._tensors.items()


# ------------------------------------------------------------------------------------------------
# Op signatures


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return 0


class _Run:
    """Where the tensors seen during one execution of the step came from."""

    def __init__(self, statics: StaticBuffers):
        self.statics = statics
        self.temps: set[int] = set()  # storages first seen as an op result: made in the step
        self.external: set[int] = set()  # storages the step reads but did not register

    def tensor_sig(self, t: torch.Tensor, is_result: bool) -> tuple:
        meta = (tuple(t.shape), t.stride() if t.layout == torch.strided else None, t.dtype)
        ptr = _storage_ptr(t)
        if not ptr:
            return ("tensor", "empty", None) + meta
        name = self.statics.name_of_storage(ptr)
        if name is not None:
            return ("tensor", "static", (name, t.storage_offset())) + meta
        if ptr in self.temps:
            return ("tensor", "temp", None) + meta
        if ptr in self.external or not is_result:
            self.external.add(ptr)
            return ("tensor", "external", ptr) + meta
        self.temps.add(ptr)
        return ("tensor", "temp", None) + meta

    def sig(self, obj, is_result: bool = False):
        if isinstance(obj, torch.Tensor):
            return self.tensor_sig(obj, is_result)
        if isinstance(obj, (tuple, list)):
            return tuple(self.sig(o, is_result) for o in obj)
        if isinstance(obj, dict):
            return tuple((k, self.sig(v, is_result)) for k, v in obj.items())
        if isinstance(obj, float):
            return "nan" if math.isnan(obj) else obj
        if obj is None or isinstance(obj, (bool, int, complex, str, torch.dtype, torch.device,
                                           torch.layout, torch.memory_format)):
            return obj
        if isinstance(obj, slice):
            return ("slice", self.sig(obj.start), self.sig(obj.stop), self.sig(obj.step))
        if obj is Ellipsis:
            return "..."
        return ("object", type(obj).__name__)


def _describe(sig) -> str:
    if isinstance(sig, tuple) and sig[:1] == ("slice",):
        return "slice({}, {}, {})".format(*(_describe(s) for s in sig[1:]))
    if isinstance(sig, tuple) and sig[:1] == ("tensor",):
        _, kind, where, shape, _, dtype = sig
        dtype_name = str(dtype).removeprefix("torch.")
        if kind == "static":
            return f"static buffer {where[0]!r} at offset {where[1]}, shape {shape} {dtype_name}"
        if kind == "external":
            return f"unregistered tensor at address {where:#x}, shape {shape} {dtype_name}"
        return f"{kind} tensor of shape {shape} {dtype_name}"
    return repr(sig)


def _first_difference(a, b, path: str) -> tuple[str, Any, Any]:
    """(path, captured, replayed) of the first place two signatures differ."""
    atomic = (("tensor",), ("slice",))
    if isinstance(a, tuple) and isinstance(b, tuple) and a[:1] not in atomic and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return path, a, b


@dataclasses.dataclass(frozen=True)
class TracedOp:
    func: Callable
    args: tuple
    result: Any

    @property
    def name(self) -> str:
        return _op_name(self.func)


class _Checker(TorchFunctionMode):
    """Refuses graph-unsafe ops; records a trace, or compares against one."""

    def __init__(self, run: _Run, trace: list[TracedOp] | None, record: bool):
        super().__init__()
        self.run = run
        self.trace = trace
        self.record = record
        self.pos = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PASSTHROUGH or getattr(func, "__name__", None) == "__get__":
            return func(*args, **kwargs)
        why = _refusal(func, args, kwargs)
        if why is not None:
            raise GraphSafetyError(f"{_op_name(func)} inside a graph-captured step: {why}")
        arg_sig = (self.run.sig(args), self.run.sig(kwargs))
        expected = self._expect(func, arg_sig)
        out = func(*args, **kwargs)
        out_sig = self.run.sig(out, is_result=True)
        if self.record:
            self.trace.append(TracedOp(func, arg_sig, out_sig))
        elif expected is not None and out_sig != expected.result:
            self._fail(expected, "result", expected.result, out_sig)
        return out

    def _expect(self, func, arg_sig) -> TracedOp | None:
        i = self.pos
        self.pos += 1
        if self.record or self.trace is None:
            return None
        if i >= len(self.trace):
            raise GraphSafetyError(
                f"replay runs more ops than the capture did: op #{i} ({_op_name(func)}) was never "
                f"captured; the step takes a host-side branch that depends on state outside the graph")
        expected = self.trace[i]
        if expected.func != func:
            raise GraphSafetyError(
                f"replay diverges from the capture at op #{i}: captured {expected.name}, replayed "
                f"{_op_name(func)}; the step takes a host-side branch a CUDA graph would have frozen")
        if expected.args != arg_sig:
            if expected.args[0] != arg_sig[0]:
                self._fail(expected, "argument", expected.args[0], arg_sig[0])
            captured, replayed = dict(expected.args[1]), dict(arg_sig[1])
            for k in sorted(captured.keys() | replayed.keys()):
                a, b = captured.get(k, "<absent>"), replayed.get(k, "<absent>")
                if a != b:
                    self._fail(expected, f"keyword argument {k!r}", a, b)
        return expected

    def _fail(self, op: TracedOp, what: str, captured, replayed):
        path, a, b = _first_difference(captured, replayed, what)
        raise GraphSafetyError(
            f"replay differs from the capture at op #{self.pos - 1} ({op.name}), {path}: captured "
            f"{_describe(a)}, replayed {_describe(b)}. A CUDA graph replays the captured shapes, "
            f"arguments and addresses; the step reads host state that changed between replays "
            f"(keep varying values in device tensors, and reuse the same static buffers)")

    def finish(self):
        if not self.record and self.trace is not None and self.pos < len(self.trace):
            raise GraphSafetyError(
                f"replay ran fewer ops than the capture: stopped before op #{self.pos} "
                f"({self.trace[self.pos].name}); the step takes a host-side branch a CUDA graph "
                f"would have frozen")


def _leaves(obj, path: str = "output"):
    """(path, leaf) pairs of a step's return value."""
    if isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            yield from _leaves(o, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}[{k!r}]")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{path}.{f.name}")
    else:
        yield path, obj


def _check_outputs(out, run: _Run) -> tuple:
    """Refuse returned tensors outside the static buffers; signature of the non-tensor leaves."""
    scalars = []
    for path, leaf in _leaves(out):
        if isinstance(leaf, torch.Tensor):
            ptr = _storage_ptr(leaf)
            if ptr and run.statics.name_of_storage(ptr) is not None:
                continue
            origin = ("a fresh allocation made inside the step" if ptr in run.temps or not ptr
                      else "a tensor that was never registered as a static buffer")
            raise GraphSafetyError(
                f"step {path} (shape {tuple(leaf.shape)}, {leaf.dtype}) is {origin}; a graph replay "
                f"reuses that memory, so results must be written into a registered static buffer")
        scalars.append((path, run.sig(leaf)))
    return tuple(scalars)


# ------------------------------------------------------------------------------------------------
# Graphs and backend


class EmulatedGraph:
    """A captured step: the function, the trace of its capture and its output signature."""

    def __init__(self, fn: Callable[[], Any], statics: StaticBuffers):
        self.fn = fn
        self.statics = statics
        self.trace: list[TracedOp] = []
        self.num_replays = 0
        self._out_sig = None

    def _execute(self, trace: list[TracedOp] | None, record: bool):
        run = _Run(self.statics)
        checker = _Checker(run, trace, record)
        with checker:
            out = self.fn()
        checker.finish()
        return out, _check_outputs(out, run)

    def check(self):
        """Run the step once under the refusal rules only (no trace)."""
        return self._execute(None, record=False)[0]

    def capture(self):
        self.trace = []
        out, self._out_sig = self._execute(self.trace, record=True)
        return out

    def replay(self):
        out, out_sig = self._execute(self.trace, record=False)
        if out_sig != self._out_sig:
            path, a, b = _first_difference(self._out_sig, out_sig, "returned values")
            raise GraphSafetyError(
                f"the step returned different non-tensor values than at capture ({path}: captured "
                f"{a!r}, replayed {b!r}); a CUDA graph returns the values computed at capture")
        self.num_replays += 1
        return out


class EmulatedGraphBackend:
    """Graph backend for CPU: capture records a trace, replay re-runs the step under the checker."""

    name = "emulated"

    def __init__(self):
        self.statics = StaticBuffers()
        self._graphs: dict[Any, EmulatedGraph] = {}

    def register_static(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Declare a tensor that outlives every replay; returns it for chaining."""
        return self.statics.add(name, tensor)

    def register_static_buffers(self, buffers: Mapping[str, torch.Tensor] | Iterable[torch.Tensor]):
        items = buffers.items() if isinstance(buffers, Mapping) else (
            (f"buffer{len(self.statics) + i}", t) for i, t in enumerate(list(buffers)))
        for name, tensor in items:
            self.statics.add(name, tensor)

    def warmup(self, fn: Callable[[], Any], iters: int = 1):
        """Run the step eagerly under the refusal rules, as the CUDA backend runs it before capture."""
        graph = EmulatedGraph(fn, self.statics)
        for _ in range(iters):
            graph.check()

    def capture(self, key, fn: Callable[[], Any]):
        if key in self._graphs:
            raise ValueError(f"a graph is already captured for key {key!r}")
        graph = EmulatedGraph(fn, self.statics)
        out = graph.capture()
        self._graphs[key] = graph
        return out

    def replay(self, key):
        return self.graph(key).replay()

    def replayer(self, key) -> Callable[[], Any]:
        return self.graph(key).replay

    def graph(self, key) -> EmulatedGraph:
        try:
            return self._graphs[key]
        except KeyError:
            raise KeyError(f"no graph captured for key {key!r}; captured: {list(self._graphs)}") from None

    def memory_bytes(self) -> int | None:
        return None
