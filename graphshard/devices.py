"""Device resolution shared by the engine, the transports and the graph backends."""

from __future__ import annotations

import torch


def resolve_device(device: torch.device | str | int | None = None) -> torch.device:
    """A device with its index (tensors report `cuda:0`, never bare `cuda`); None picks the
    current CUDA device where there is one, else the CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
