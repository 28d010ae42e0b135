"""Host cost of a step's copy-in, three ways: whether one batched driver call would beat three.

Usage: python3 -m benchmarks.copy_cost [--rounds 300] [--rows 192] [--out copy_cost.json]

A step copies up to three of the caller's tensors (logits, drafts, bitmask) into the engine's
static buffers. `StepInputs.write_tensors` makes one `cuMemcpyDtoDAsync` per tensor
(`runtime.memcpy.DeviceCopier`); in the mixed workload that is `write_tensors`' 35 µs of host
time on an H100 host and 56-64 on an H200 host, where its Python is a few µs. This times, per
round, the three copies of the mixed workload's shapes (V = 32000 bf16 logits, int32 drafts,
a 1000-word bitmask; `--rows` rows) made
- `copy_`: three `Tensor.copy_`;
- `driver`: three `DeviceCopier` calls;
- `batch`: one `cuMemcpyBatchAsync_v2` of three copies (CUDA 13's driver API; stream order for
  its sources, one attributes entry),
each way on alternate rounds, with NumPy work between rounds that evicts the host's caches as a
decode loop's other work does (a loop runs the copy-in cold). It checks after each round that
the buffers hold what `copy_` writes, and prints the host µs p50 and p90 of each way. One GPU;
the batch way is left out, with the driver's refusal printed, where the driver lacks it.

The driver refuses a batch on the legacy default stream (CUDA_ERROR_INVALID_VALUE, seen on an
H100 with CUDA 13.0), the stream a step's copy-in runs on in a loop that never picks one. So
the rounds run on a stream of their own, and the result records what a one-copy batch on the
legacy default stream returned (`batch_on_default_stream`: the CUresult, 0 where accepted).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import numpy as np
import torch

from graphshard.runtime.memcpy import _raw_stream, device_copier, driver_entry

# CUmemcpySrcAccessOrder: the source is read in stream order, behind the kernels that wrote it.
SRC_ACCESS_ORDER_STREAM = 1


class _Location(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class MemcpyAttributes(ctypes.Structure):  # CUmemcpyAttributes (v1), 24 bytes
    _fields_ = [("srcAccessOrder", ctypes.c_int), ("srcLocHint", _Location),
                ("dstLocHint", _Location), ("flags", ctypes.c_uint)]


class BatchCopy:
    """One `cuMemcpyBatchAsync_v2` of up to `capacity` device-to-device copies on the current
    stream of `device`: `call(count)` after filling `dsts`, `srcs` and `sizes`; the CUresult.
    `fn` and `stream` stand in for the driver's entry point and the stream handle (tests)."""

    def __init__(self, device: torch.device, capacity: int = 3, fn=None, stream=None):
        fn = fn or driver_entry(device, "cuMemcpyBatchAsync_v2", (ctypes.c_void_p,) * 3 + (
            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p))
        if fn is None:
            raise RuntimeError("the driver lacks cuMemcpyBatchAsync_v2 (CUDA 13)")
        self._fn = fn
        self._stream = stream or _raw_stream(device)
        self.dsts = (ctypes.c_uint64 * capacity)()
        self.srcs = (ctypes.c_uint64 * capacity)()
        self.sizes = (ctypes.c_size_t * capacity)()
        self._attrs = MemcpyAttributes(srcAccessOrder=SRC_ACCESS_ORDER_STREAM)
        self._attr_index = (ctypes.c_size_t * 1)(0)  # the one entry applies from copy 0 on

    def call(self, count: int) -> int:
        return self._fn(self.dsts, self.srcs, self.sizes, count, ctypes.byref(self._attrs),
                        self._attr_index, 1, self._stream())


def _tensors(rows: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(rows, 32000, device=device, generator=g).to(torch.bfloat16),
            torch.randint(0, 32000, (rows,), device=device, generator=g, dtype=torch.int32),
            torch.randint(-2**31, 2**31 - 1, (rows, 1000), device=device, generator=g,
                          dtype=torch.int32))


def run(rounds: int, rows: int) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    dst = [torch.empty_like(t) for t in _tensors(rows, device, 0)]
    sources = [_tensors(rows, device, seed) for seed in range(1, 5)]
    copier = device_copier(device)
    ways = ["copy_", "driver"]
    try:
        batch = BatchCopy(device)
        ways.append("batch")
    except RuntimeError as e:
        print(f"no batch copy: {e}")

    def copy_(src):
        for d, s in zip(dst, src):
            d.copy_(s, non_blocking=True)

    def driver(src):
        for d, s in zip(dst, src):
            if not copier(d.data_ptr(), s.data_ptr(), s.numel() * s.element_size()):
                raise RuntimeError(f"the driver refused a copy ({copier.refused})")

    def batched(src):
        for i, (d, s) in enumerate(zip(dst, src)):
            batch.dsts[i], batch.srcs[i] = d.data_ptr(), s.data_ptr()
            batch.sizes[i] = s.numel() * s.element_size()
        code = batch.call(len(dst))
        if code:
            raise RuntimeError(f"cuMemcpyBatchAsync_v2 returned {code}")

    fns = {"copy_": copy_, "driver": driver, "batch": batched}
    on_default = _batch_on_default_stream(batch, dst, sources[0]) if "batch" in ways else None
    spent = {way: [] for way in ways}
    with torch.cuda.stream(torch.cuda.Stream(device)):
        _time_rounds(rounds, ways, fns, spent, dst, sources)
    warm = rounds // 10
    return {"device": torch.cuda.get_device_name(device), "rows": rows,
            "batch_on_default_stream": on_default,
            "us": {way: {"p50": float(np.median(v[warm:])),
                         "p90": float(np.percentile(v[warm:], 90))} for way, v in spent.items()}}


def _batch_on_default_stream(batch: "BatchCopy", dst, src) -> int:
    """The CUresult of a one-copy batch on the legacy default stream (0: accepted)."""
    with torch.cuda.stream(torch.cuda.default_stream()):
        batch.dsts[0], batch.srcs[0] = dst[1].data_ptr(), src[1].data_ptr()
        batch.sizes[0] = src[1].numel() * src[1].element_size()
        code = batch.call(1)
        torch.cuda.synchronize()
    return code


def _time_rounds(rounds: int, ways: list, fns: dict, spent: dict, dst, sources) -> None:
    junk = np.random.default_rng(0).random(1 << 21)  # 16 MB
    torch.cuda.synchronize()
    for r in range(rounds):
        for way in (ways if r % 2 == 0 else ways[::-1]):
            src = sources[r % len(sources)]
            junk.sum()
            torch.cuda.synchronize()
            t = time.perf_counter()
            fns[way](src)
            spent[way].append((time.perf_counter() - t) * 1e6)
            torch.cuda.synchronize()
            if r < 8 or r % 50 == 0:
                for d, s in zip(dst, src):
                    if not torch.equal(d, s):
                        raise AssertionError(f"{way}: a buffer differs from its source")
                for d in dst:
                    d.zero_()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--rows", type=int, default=192)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("copy_cost needs a CUDA GPU")
    result = run(args.rounds, args.rows)
    print(f"{result['device']}; {args.rows} rows; host µs per step's three copies on a stream of "
          f"their own (p50, p90):")
    if result["batch_on_default_stream"] is not None:
        print(f"  (a batch on the legacy default stream returned "
              f"{result['batch_on_default_stream']})")
    for way, us in result["us"].items():
        print(f"  {way:7} {us['p50']:7.1f} {us['p90']:7.1f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
