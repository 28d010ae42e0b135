"""Strategy `auto`: time the shard and replicate graphs of every bucket, agree, keep the faster.

Timings are taken on every rank and reduced with MAX, so every rank sees the same numbers and
makes the same choice (a rank that picked differently would pair the wrong collectives).
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from graphshard.config import REPLICATE, SHARD  # the strategy names, listed in config.py


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_replays(manager, key: tuple, device: torch.device, iters: int) -> float:
    """Median seconds per replay of one captured graph."""
    samples = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        manager.backend.replay(key)
        _sync(device)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def choose_strategies(engine, iters: int = 10) -> tuple[dict[int, str], dict[int, tuple[float, float]]]:
    """Per bucket, the strategy whose graph replayed faster (both must be captured), and the
    timings behind it: bucket -> (shard s, replicate s), the slowest rank's median per replay."""
    buckets = engine.config.buckets
    m = engine.config.max_num_logits_per_req
    times = torch.zeros(len(buckets), 2, dtype=torch.float64)
    for i, b in enumerate(buckets):
        engine._write_placeholder_batch(b)
        balanced = engine.transport.pick_capacity(b * m, -(-b // engine.tp_size))
        times[i, 0] = time_replays(engine.graphs, (b, SHARD, balanced), engine.device, iters)
        times[i, 1] = time_replays(engine.graphs, (b, REPLICATE, 0), engine.device, iters)
    if engine.group is not None:
        reduced = times.to(engine.device) if engine.device.type == "cuda" else times
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=engine.group)
        times = reduced.cpu()
    timings = {b: (float(times[i, 0]), float(times[i, 1])) for i, b in enumerate(buckets)}
    choices = {b: SHARD if shard <= replicate else REPLICATE for b, (shard, replicate) in timings.items()}
    return choices, timings
