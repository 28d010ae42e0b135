"""What `Engine.capture()` captures, and what it compiles before the first graph.

- `graph_keys`: every graph of every bucket: one per capacity tier, both strategies while
  "auto" has not chosen, and at tp = 1 with bitmask-free graphs each bucket again without
  bitmask support;
- `fallback_keys`: the sampler calls that steps above the largest bucket can make;
- `compile_samplers`: the sampler variants of those keys, compiled on threads, so that neither
  the warm-up runs nor a decode step waits on a compile;
- `timing_keys` and `placeholder_batch`: what the warm-up, capture and "auto" timing runs replay.
"""

from __future__ import annotations

import numpy as np
import torch

from graphshard.config import Config
from graphshard.engine.routes import eager_keys, keys_for, unmasked
from graphshard.engine.strategy import REPLICATE, SHARD
from graphshard.runtime.launch import Launch, compile_launches, compile_workers

# How much later than the others a rank may finish compiling the sampler at capture.
COMPILE_SKEW_S = 600.0


def graph_keys(config: Config, strategy: dict[int, str], tiers: dict[int, tuple[int, ...]],
               auto: bool, bitmask_free: bool) -> list[tuple]:
    """The keys of every graph to capture, in the order of `config.buckets` (the graph manager
    captures the largest first). `strategy` is each bucket's strategy, ignored under `auto`
    (both are captured and timed); `tiers` each bucket's capacity tiers (shard only)."""
    keys = []
    for b in config.buckets:
        for s in ((SHARD, REPLICATE) if auto else (strategy[b],)):
            keys += keys_for(b, s, tiers.get(b))
    if bitmask_free:  # tp = 1: one replicate key a bucket
        keys += [unmasked(key) for key in keys]
    return keys


def fallback_keys(config: Config, strategy: dict[int, str], tp_size: int,
                  auto: bool) -> list[tuple]:
    """The keys of the sampler calls that steps above the largest bucket can make. They take the
    largest bucket's strategy, which `auto` picks only after the compile: then both."""
    if config.fallback != "eager":
        return []
    strategies = (SHARD, REPLICATE) if auto else (strategy[config.max_bucket],)
    return eager_keys(config.max_bucket, config.max_num_reqs, strategies, tp_size)


def compile_samplers(launches: list[Launch], device: torch.device, tp_size: int) -> int:
    """Compile the kernel variants of `launches` on threads, running nothing on the device;
    returns how many were compiled. A vocabulary-sized finish variant takes a minute or more of
    a core (`graphshard.runtime.launch`): compiled at first launch, the warm-up runs would
    compile them one after another, and the first batch above the largest bucket would stall
    its decode loop on its own."""
    # The ranks of a host compile the same variants at once: they share its cores.
    workers = max(1, compile_workers() // min(tp_size, torch.cuda.device_count()))
    with torch.cuda.device(device):
        return compile_launches(launches, workers)


def timing_keys(config: Config, tp_size: int, transport) -> dict[int, tuple[tuple, tuple]]:
    """Per bucket, the shard and the replicate graph that its placeholder batch replays."""
    m = config.max_num_logits_per_req
    return {b: ((b, SHARD, transport.pick_capacity(b * m, -(-b // tp_size))), (b, REPLICATE, 0))
            for b in config.buckets}


def placeholder_batch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A valid batch of n requests for warm-up, capture and timing runs: slots 0..n-1 (balanced
    over the ranks), one row each, at position 0. Returns (idx_mapping, cu_num_logits, seq_lens)."""
    return (np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32),
            np.zeros(n, np.int32))
