"""Stream-ordered copies of contiguous bytes through the CUDA driver: device to device
(`device_copier`), and from pinned host memory to the device (`host_copier`).

A step copies up to three of the caller's tensors into the engine's static buffers. Through
`Tensor.copy_` each copy is a dispatch, a TensorIterator and a launch: ~18-20 µs of host time
per tensor on the H100 hosts, 55-62 µs of a graph step's ~140 µs of issue time in the mixed
workload (BENCHMARKS.md). Through the driver's asynchronous copy (ctypes) the three took 35
µs p50 there. It runs on torch's current stream of the device, so it is ordered with the
step's graph exactly as `copy_` was. The staging rows' pull from pinned memory goes the same
way (15-28 µs less host time an eager step on an H200 host).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable

import torch

_LIBRARY = "libcuda.so.1"


class DeviceCopier:
    """`copier(dst_ptr, src_ptr, nbytes)` enqueues a copy of `nbytes` bytes between two device
    addresses on the current stream of `device`: True, or False where the driver refused it
    (nothing enqueued; the caller copies another way, which reports what is wrong). The last
    refusal's CUresult is kept in `refused`."""

    def __init__(self, device: torch.device, memcpy: Callable[..., int]):
        self.device = device
        self._memcpy = memcpy
        self._stream = _raw_stream(device)
        self.refused: int | None = None

    def __call__(self, dst_ptr: int, src_ptr: int, nbytes: int) -> bool:
        if nbytes:
            code = self._memcpy(dst_ptr, src_ptr, nbytes, self._stream())
            if code:
                self.refused = code
                return False
        return True


def device_copier(device: torch.device) -> DeviceCopier | None:
    """A `DeviceCopier` between device addresses for a CUDA device whose driver library loads,
    else None (the caller keeps `copy_`)."""
    return _copier(device, "cuMemcpyDtoDAsync_v2")


def host_copier(device: torch.device) -> DeviceCopier | None:
    """A `DeviceCopier` from pinned host memory to `device` (`dst_ptr` on the device, `src_ptr`
    a page-locked host address: a captured graph takes it as a copy node, which reads the host
    bytes as they are at replay), else None."""
    return _copier(device, "cuMemcpyHtoDAsync_v2")


def _copier(device: torch.device, name: str) -> DeviceCopier | None:
    memcpy = driver_entry(device, name, (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t,
                                         ctypes.c_void_p))
    return None if memcpy is None else DeviceCopier(device, memcpy)


def driver_entry(device: torch.device, name: str, argtypes: tuple):
    """The driver's entry point `name` (returning a CUresult, taking `argtypes`) for a CUDA
    `device`, or None off CUDA, where the driver library does not load or lacks it."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        fn = getattr(ctypes.CDLL(ctypes.util.find_library("cuda") or _LIBRARY), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def _raw_stream(device: torch.device) -> Callable[[], int]:
    """The current stream's handle on `device` (what Triton launches on), without building a
    `torch.cuda.Stream` object each call."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return lambda: torch._C._cuda_getCurrentRawStream(index)
