"""CUDA graph backend: one `torch.cuda.CUDAGraph` per key, all captured into one shared pool.

Graphs are captured largest first so the smaller ones reuse the temporaries the largest freed in
the shared pool. Before capture every step runs a few times on a side stream: that compiles the
Triton kernels, creates and warms NCCL communicators and lets the caching allocator settle, none
of which may happen during capture.
"""

from __future__ import annotations

import gc
from typing import Any, Callable, Iterable, Mapping

import torch

from graphshard.runtime.devices import resolve_device


class CudaGraphBackend:
    """Captures steps into CUDA graphs sharing one memory pool and replays them by key."""

    name = "cuda"

    def __init__(self, device: torch.device | str | int | None = None, *,
                 capture_error_mode: str = "thread_local"):
        if not torch.cuda.is_available():
            raise RuntimeError("CudaGraphBackend needs a CUDA device; use EmulatedGraphBackend on CPU")
        device = resolve_device(device)
        if device.type != "cuda":
            raise ValueError(f"CudaGraphBackend needs a cuda device, got {device}")
        self.device = device
        # "thread_local": the NCCL watchdog may query events from its own thread during capture.
        self.capture_error_mode = capture_error_mode
        with torch.cuda.device(device):
            self.pool = torch.cuda.graph_pool_handle()
            self.capture_stream = torch.cuda.Stream()
            self.warmup_stream = torch.cuda.Stream()
        # Everything a graph reads or writes must outlive it: keep it all on this object.
        self._static: dict[str, torch.Tensor] = {}
        self._graphs: dict[Any, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[Any, Any] = {}
        self._graph_bytes = 0

    def register_static(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Declare a tensor that outlives every replay; returns it for chaining."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"static buffer {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != self.device:
            raise ValueError(f"static buffer {name!r} is on {tensor.device}, graphs run on {self.device}")
        old = self._static.get(name)
        if old is not None and old is not tensor:
            raise ValueError(f"static buffer {name!r} is already registered with a different tensor")
        self._static[name] = tensor
        return tensor

    def register_static_buffers(self, buffers: Mapping[str, torch.Tensor] | Iterable[torch.Tensor]):
        items = buffers.items() if isinstance(buffers, Mapping) else (
            (f"buffer{len(self._static) + i}", t) for i, t in enumerate(list(buffers)))
        for name, tensor in items:
            self.register_static(name, tensor)

    def warmup(self, fn: Callable[[], Any], iters: int = 3):
        """Run the step eagerly on a side stream, as graph capture requires before the first capture."""
        current = torch.cuda.current_stream(self.device)
        self.warmup_stream.wait_stream(current)
        with torch.cuda.device(self.device), torch.cuda.stream(self.warmup_stream):
            for _ in range(iters):
                fn()
        current.wait_stream(self.warmup_stream)
        torch.cuda.synchronize(self.device)

    def capture(self, key, fn: Callable[[], Any]):
        """Capture `fn` as the graph of `key`; returns what `fn` returned during capture."""
        if key in self._graphs:
            raise ValueError(f"a graph is already captured for key {key!r}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device):
            # Settle the allocator first so the reserved-memory delta counts only the pool's growth.
            torch.cuda.synchronize(self.device)
            gc.collect()
            torch.cuda.empty_cache()
            before = torch.cuda.memory_reserved(self.device)
            with torch.cuda.graph(graph, pool=self.pool, stream=self.capture_stream,
                                  capture_error_mode=self.capture_error_mode):
                out = fn()
            torch.cuda.synchronize(self.device)
            self._graph_bytes += max(0, torch.cuda.memory_reserved(self.device) - before)
        self._graphs[key] = graph
        self._outputs[key] = out
        return out

    def replay(self, key):
        """Launch the graph of `key` on the current stream; returns the outputs captured with it."""
        self.replayer(key)()
        return self._outputs[key]

    def replayer(self, key) -> Callable[[], None]:
        """The launch of the graph of `key` on the current stream, as a call."""
        try:
            return self._graphs[key].replay
        except KeyError:
            raise KeyError(f"no graph captured for key {key!r}; captured: {list(self._graphs)}") from None

    def memory_bytes(self) -> int | None:
        """Device memory the shared pool grew by while capturing (reserved-bytes delta)."""
        return self._graph_bytes
