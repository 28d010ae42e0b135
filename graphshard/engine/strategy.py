"""Strategy `auto`: time the shard and replicate graphs of every bucket, agree, keep the faster.

Timings are taken on every rank and reduced with MAX, so every rank sees the same numbers and
makes the same choice (a rank that picked differently would pair the wrong collectives).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from graphshard.config import REPLICATE, SHARD  # the strategy names, listed in config.py


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_replays(graphs, key: tuple, device: torch.device, iters: int) -> float:
    """Median seconds per replay of one captured graph. Through the backend: timing runs are not
    steps, so the manager's replay counts stay as they are."""
    samples = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        graphs.backend.replay(key)
        _sync(device)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def choose_strategies(graphs, keys: dict[int, tuple[tuple, tuple]], prepare: Callable[[int], None],
                      device: torch.device, group, iters: int = 10
                      ) -> tuple[dict[int, str], dict[int, tuple[float, float]]]:
    """Per bucket, the strategy whose graph replayed faster, and the timings behind it: bucket ->
    (shard s, replicate s), the slowest rank's median per replay. `keys` maps each bucket to its
    (shard, replicate) graph keys, both captured; `prepare(b)` stages a valid batch of b
    requests for them to replay; `group` is the TP process group (None at tp = 1)."""
    buckets = list(keys)
    times = torch.zeros(len(buckets), 2, dtype=torch.float64)
    for i, b in enumerate(buckets):
        prepare(b)
        for j, key in enumerate(keys[b]):
            times[i, j] = time_replays(graphs, key, device, iters)
    if group is not None:
        reduced = times.to(device) if device.type == "cuda" else times
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)
        times = reduced.cpu()
    timings = {b: (float(times[i, 0]), float(times[i, 1])) for i, b in enumerate(buckets)}
    choices = {b: SHARD if shard <= replicate else REPLICATE for b, (shard, replicate) in timings.items()}
    return choices, timings
