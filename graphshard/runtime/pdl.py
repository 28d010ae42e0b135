"""Programmatic dependent launch (PDL; GPUs of compute capability 9.0 and newer).

A kernel launched as a programmatic dependent of the kernel before it in its stream may be
scheduled while that one still runs; in a captured graph the edge between the two becomes a
programmatic one. The dependent waits (`griddepcontrol.wait`: its predecessor complete and that
one's memory visible) before it touches memory, so what it computes is what a plain launch
computes; what it saves is the gap between the two kernels.

The contract of every kernel launched so: `follow_producer(PDL)` runs before its first load or
store, on every path, early exits included. The waits then chain: a kernel that waited for its
predecessor, which waited for its own, finishes after both. One that skipped the wait could
finish before its predecessor's predecessor, and the next kernel's wait would not cover that.

Right after its wait a program lets its own dependents launch (`griddepcontrol.launch_dependents`).
They launch once every program of this kernel has done so, that is once its last program has
started: their programs then park on the SMs in their own wait, and none of this kernel's
programs is still waiting for a slot they could take.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

MIN_CAPABILITY = (9, 0)


def supports_pdl(device: torch.device | str) -> bool:
    """Whether kernels on `device` can be launched as programmatic dependents."""
    return _supports_pdl(torch.device(device))


@functools.lru_cache(maxsize=None)
def _supports_pdl(device: torch.device) -> bool:
    # Cached: an eager step's launcher asks every call.
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def check_pdl(pdl: bool, device: torch.device, where: str) -> None:
    """A launcher's check of its `pdl` argument."""
    if not isinstance(pdl, bool):
        raise TypeError(f"{where}: pdl must be a bool, got {type(pdl).__name__}")
    if pdl and not supports_pdl(device):
        raise ValueError(f"{where}: pdl needs a CUDA device of compute capability "
                         f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer, got {device}")


def pdl_options(pdl: bool) -> dict:
    """What a launcher passes a kernel it launches as a programmatic dependent: the kernel's
    `PDL` constexpr (`follow_producer`) and Triton's `launch_pdl` option. Nothing otherwise, so
    a plain launch has the keyword arguments of a launcher without the option."""
    return {"PDL": True, "launch_pdl": True} if pdl else {}


@triton.jit
def follow_producer(PDL: tl.constexpr):
    """A programmatic dependent's first statement: wait for the kernel before it, then let the
    kernel after it launch."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def lead_dependents(LAUNCH: tl.constexpr):
    """With LAUNCH, let the kernel after this one launch now (its programs park in their own
    wait, which covers the whole of this kernel). Alone, the first statement of a kernel that is
    no dependent itself but has one: at tp = 1 the step's fetch, after the copy node."""
    if LAUNCH:
        tl.extra.cuda.gdc_launch_dependents()
