"""What one more graph node and each way of reading results to the host cost a decode loop.

Usage: python3 -m benchmarks.graph_read [--steps 2000] [--out graph_read.json]

One GPU. Every loop is back to back: replay a captured graph, read a [32, 4] int32 result to
the host, median µs over the steps after the first quarter.
- nodes N: a graph of N one-program kernels, each reading the word the one before wrote; read
  with `.cpu()` (a copy to pageable memory, which waits for the stream).
- read cpu / stream sync + pinned / pinned done word: a graph of 4 such kernels whose result is
  read by `.cpu()`; by a copy node into pinned memory at the graph's end, a stream
  synchronize and a NumPy copy; or by the last kernel storing the result and then a step number
  into pinned memory itself, the host spinning on that number and copying NumPy.
- publish: device µs of the engine's tp = 1 last kernel (`graphshard.engine.readout`) storing
  1024 records of 46 words (20 logprobs) into pinned memory, with one program and with the grid
  the engine launches for a bucket of 1024 (CUDA events around a graph of 10).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton
import triton.language as tl

from benchmarks.timing import graph_of, replay_us
from graphshard.engine.readout import HostRecords
from graphshard.plan.staging import Staging

ROWS, WIDTH = 32, 4


@triton.jit
def _link_kernel(src_ptr, dst_ptr):
    """One node of a chain: the previous node's words plus one."""
    offs = tl.arange(0, 128)  # [ROWS * WIDTH]
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs) + 1)


@triton.jit
def _publish_kernel(src_ptr, host_address_ptr, done_address_ptr, seq_ptr):
    """The chain's result into pinned host memory, then the step number after it."""
    offs = tl.arange(0, 128)  # [ROWS * WIDTH]
    seq = tl.load(seq_ptr) + 1
    tl.store(seq_ptr, seq)
    host = tl.load(host_address_ptr).to(tl.pointer_type(tl.int32))
    tl.store(host + offs, tl.load(src_ptr + offs))
    done = tl.load(done_address_ptr).to(tl.pointer_type(tl.int64))
    tl.atomic_xchg(done, seq.to(tl.int64), sem="release", scope="sys")


@triton.jit
def _pull_kernel(host_address_ptr, dst_ptr, DEPENDENT: tl.constexpr):
    """The chain's input read from pinned host memory by the kernel itself: one round trip over
    the host link, or two when the first load decides where the second reads (as a fetch that
    reads the step's count first would)."""
    offs = tl.arange(0, 128)  # [ROWS * WIDTH]
    src = tl.load(host_address_ptr).to(tl.pointer_type(tl.int32))
    if DEPENDENT:
        src += (tl.load(src) < -12345).to(tl.int32)  # 0, but its address waits for the load
    tl.store(dst_ptr + offs, tl.load(src + offs))


def chain(nodes: int, buf: torch.Tensor):
    def run():
        for i in range(nodes):
            _link_kernel[(1,)](buf[i % 2], buf[(i + 1) % 2])
    return run


def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def loop_us(graph: torch.cuda.CUDAGraph, read, steps: int) -> dict:
    total, issue = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        read()
        total.append(time.perf_counter() - t0)
        issue.append(t1 - t0)
    skip = steps // 4
    return {"step_us": float(np.median(total[skip:])) * 1e6,
            "replay_call_us": float(np.median(issue[skip:])) * 1e6}


def publish_us(dev) -> dict[int, float]:
    """Device µs per publish of 1024 records of 46 words, grid for a bucket of 1 or of 1024."""
    staging = Staging(max_num_reqs=1024, device=dev)
    idx = np.arange(1024, dtype=np.int32)
    staging.write(0, idx, np.arange(1025, dtype=np.int32), idx, False)
    staging.fetch()
    host = HostRecords(torch.ones(1024, 46, dtype=torch.int32, device=dev), staging,
                       staging.views()[0])
    return {grid_for: replay_us(graph_of(lambda: host.publish(grid_for), 10), 10)["median_us"]
            for grid_for in (1, 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--out", default="graph_read.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    buf = torch.zeros(2, ROWS * WIDTH, dtype=torch.int32, device=dev)
    rows = []
    for nodes in (1, 2, 3, 4, 5, 6, 8):
        graph = capture(chain(nodes, buf))
        out = buf[nodes % 2]
        rows.append(dict(case=f"nodes {nodes}", read="cpu", **loop_us(graph, out.cpu, args.steps)))

    base = chain(4, buf)
    result = buf[0]
    rows.append(dict(case="nodes 4", read="cpu", **loop_us(capture(base), result.cpu, args.steps)))

    pinned = torch.zeros(ROWS * WIDTH, dtype=torch.int32, pin_memory=True)

    def with_copy():
        base()
        pinned.copy_(result, non_blocking=True)

    stream = torch.cuda.current_stream()
    rows.append(dict(case="nodes 4 + copy node", read="stream sync + pinned",
                     **loop_us(capture(with_copy), lambda: (stream.synchronize(),
                                                            pinned.numpy().copy()), args.steps)))

    done = torch.full((1,), -1, dtype=torch.int64, pin_memory=True)
    seq = torch.full((1,), -1, dtype=torch.int32, device=dev)
    host_address = torch.tensor([pinned.data_ptr()], dtype=torch.int64, device=dev)
    done_address = torch.tensor([done.data_ptr()], dtype=torch.int64, device=dev)

    def with_publish():
        for i in range(3):
            _link_kernel[(1,)](buf[i % 2], buf[(i + 1) % 2])
        _publish_kernel[(1,)](buf[1], host_address, done_address, seq)

    graph = capture(with_publish)
    torch.cuda.synchronize()
    done_view = done.numpy()
    state = {"step": int(done_view[0])}

    def spin_read():
        state["step"] += 1
        while done_view[0] < state["step"]:
            pass
        return pinned.numpy().copy()

    rows.append(dict(case="nodes 4, last stores to pinned", read="pinned done word",
                     **loop_us(graph, spin_read, args.steps)))

    # How the step's inputs get in: a copy node, or the first kernel reading pinned memory.
    staged = torch.ones(ROWS * WIDTH, dtype=torch.int32, pin_memory=True)
    staged_address = torch.tensor([staged.data_ptr()], dtype=torch.int64, device=dev)

    def copy_in():
        buf[0].copy_(staged, non_blocking=True)
        with_publish()

    def pull_in(dependent):
        def run():
            _pull_kernel[(1,)](staged_address, buf[0], DEPENDENT=dependent)
            for i in range(2):
                _link_kernel[(1,)](buf[i % 2], buf[(i + 1) % 2])
            _publish_kernel[(1,)](buf[0], host_address, done_address, seq)
        return run

    for case, fn in (("copy node + nodes 4", copy_in),
                     ("nodes 4, the first reads pinned", pull_in(False)),
                     ("nodes 4, the first reads pinned twice", pull_in(True))):
        graph = capture(fn)
        torch.cuda.synchronize()
        state["step"] = int(done_view[0])
        rows.append(dict(case=case + ", last stores to pinned", read="pinned done word",
                         **loop_us(graph, spin_read, args.steps)))
    for r in rows:
        print(f"{r['case']:>34} {r['read']:>22}: step {r['step_us']:6.1f} µs, "
              f"replay() {r['replay_call_us']:5.1f} µs", flush=True)
    for grid_for, us in publish_us(dev).items():
        rows.append({"case": f"publish 1024 x 46 words, grid for {grid_for}", "device_us": us})
        print(f"publish 1024 x 46 words, grid for bucket {grid_for}: {us:.1f} µs", flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
