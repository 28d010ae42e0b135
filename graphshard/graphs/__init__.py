"""Graph backends (CUDA, emulated on CPU) and the per-bucket graph manager."""

from __future__ import annotations

import torch

from graphshard.config import GRAPH_BACKENDS
from graphshard.graphs.cuda import CudaGraphBackend
from graphshard.graphs.emulated import EmulatedGraph, EmulatedGraphBackend, GraphSafetyError, StaticBuffers
from graphshard.graphs.manager import (
    BatchTooLargeError,
    GraphBackend,
    GraphManager,
    GraphStats,
    bucket_of,
    build_bucket_table,
)


def make_backend(kind: str, device: torch.device | str | None = None):
    """The graph backend for config value `kind`; "auto" picks CUDA graphs on a CUDA device."""
    if kind not in GRAPH_BACKENDS:
        raise ValueError(f"graph backend must be one of {', '.join(GRAPH_BACKENDS)}, got {kind!r}")
    if kind == "auto":
        on_cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
        kind = "cuda" if on_cuda else "emulated"
    if kind == "cuda":
        return CudaGraphBackend(device)
    return EmulatedGraphBackend()


__all__ = [
    "BatchTooLargeError",
    "CudaGraphBackend",
    "EmulatedGraph",
    "EmulatedGraphBackend",
    "GraphBackend",
    "GraphManager",
    "GraphSafetyError",
    "GraphStats",
    "StaticBuffers",
    "bucket_of",
    "build_bucket_table",
    "make_backend",
]
