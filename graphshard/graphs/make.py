"""Which graph backend a config value names."""

from __future__ import annotations

import torch

from graphshard.config import GRAPH_BACKENDS
from graphshard.graphs.cuda import CudaGraphBackend
from graphshard.graphs.emulated import EmulatedGraphBackend


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
