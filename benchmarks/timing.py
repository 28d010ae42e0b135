"""Device-side timing shared by the benchmarks: CUDA events around graph replays."""

from __future__ import annotations

import statistics
import time

import torch


def _warm_up(fn) -> None:
    """Three calls on a side stream (kernels compiled, allocations made) before a capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)


def graph_of(fn, repeat: int) -> torch.cuda.CUDAGraph:
    """Capture `repeat` back-to-back calls of `fn` in one graph (after a warm-up on a side stream)."""
    _warm_up(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            fn()
    torch.cuda.synchronize()
    return graph


def captured(fn):
    """(graph, its output): one call of `fn` captured in a CUDA graph after the same warm-up."""
    _warm_up(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def replay_us(graph: torch.cuda.CUDAGraph, per_replay: int, trials: int = 20) -> dict:
    """Median and p90 device microseconds per call, from events around each replay."""
    times = []
    for _ in range(trials + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / per_replay)
    times = sorted(times[3:])
    return {"median_us": statistics.median(times), "p90_us": times[int(0.9 * (len(times) - 1))]}


def events_us(fn, iters: int = 30, warmup: int = 3, barrier: bool = False) -> float:
    """Median device microseconds of `fn()` between two CUDA events (after `warmup` calls);
    with `barrier`, every rank starts each call together."""
    import torch.distributed as dist

    times = []
    for i in range(warmup + iters):
        if barrier:
            dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def benchmark_graph(benchmark, fn, repeat: int, rounds: int) -> dict:
    """Capture `repeat` calls of `fn` in one graph; pytest-benchmark times replay + sync, and the
    returned device times (per call, from events) go into the report's extra_info."""
    graph = graph_of(fn, repeat)
    stats = replay_us(graph, repeat)

    def timed():
        graph.replay()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=rounds, warmup_rounds=2)
    benchmark.extra_info.update(calls_per_replay=repeat)
    return stats


def measure_peak_p2p_gbs(nbytes: int = 1 << 28) -> float:
    """Peer copy bandwidth GPU0 -> GPU1 (one direction), for the achieved-GB/s columns."""
    if torch.cuda.device_count() < 2:
        return float("nan")
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize("cuda:0")
    torch.cuda.synchronize("cuda:1")
    times = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize("cuda:0")
        torch.cuda.synchronize("cuda:1")
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9
