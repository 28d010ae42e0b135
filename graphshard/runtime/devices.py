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


def check_kernels_run_on(device: torch.device) -> None:
    """Raise `EngineStateError` if graphshard's Triton kernels cannot run on `device`: on the CPU
    only Triton's interpreter runs them, and it must be chosen before the kernels are imported."""
    if device.type != "cpu":
        return
    import os

    from graphshard.plan import staging  # a module of kernels the engine always launches
    from graphshard.runtime.launch import compiles_kernels

    if any(compiles_kernels(v) for v in vars(staging).values()):
        from graphshard.errors import EngineStateError

        raise EngineStateError(
            "graphshard's Triton kernels were loaded compiled, but this engine runs on the CPU, "
            "where only Triton's interpreter runs them (TRITON_INTERPRET="
            f"{os.environ.get('TRITON_INTERPRET')!r} when they were imported). Set "
            "TRITON_INTERPRET=1 in the environment before Python imports graphshard, or leave it "
            "unset on a machine without CUDA (graphshard then sets it).")
