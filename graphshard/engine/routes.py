"""Which captured graph serves a batch: graph keys and the per-batch-size routes to them.

A graph key is `(bucket, strategy, capacity)`: the batch size it serves, "shard" or "replicate",
and (shard only) the per-destination row capacity of the exchange. Padded transports capture
one graph per capacity tier of a bucket and a step takes the smallest tier its busiest owner
fits; p2p reads the counts on the device and has one tier. A tp = 1 engine with bitmask support
also captures each bucket without it, under the key with `NO_BITMASK` appended (`unmasked`), for
the steps that pass no bitmask. The engine builds one `Route` per batch size at capture, so a
step finds its graph with a list index.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from graphshard.sample.records import SamplerOutput
from graphshard.engine.strategy import REPLICATE, SHARD
from graphshard.transports.base import pick_tier
from graphshard.plan.layout import owner_counts, owner_ranks


# A graph key's last entry when its step has no bitmask support (`unmasked`).
NO_BITMASK = "no_bitmask"


class Route:
    """How a captured batch of n requests runs: its graph key (or the key of each capacity tier),
    the replay of each (`GraphManager.replayer`), the replay of its graph without bitmask support
    for steps that pass no bitmask (None where there is none) and the output views of its first
    n records."""

    __slots__ = ("key", "tiers", "keys", "replays", "replay", "unmasked", "out")

    def __init__(self, keys: list[tuple], replays: list[Callable[[], None]], out: SamplerOutput,
                 unmasked: Callable[[], None] | None = None):
        self.key = keys[0] if len(keys) == 1 else None
        self.tiers = tuple(k[2] for k in keys) if len(keys) > 1 else None
        self.keys, self.replays = keys, replays
        self.replay = replays[0] if len(keys) == 1 else None  # the one graph, when there is one
        self.unmasked = unmasked
        self.out = out

    def key_for(self, idx: np.ndarray, cu: np.ndarray, tp_size: int, one_row: bool) -> tuple:
        return self.keys[self._tier(idx, cu, tp_size, one_row)]

    def replay_for(self, idx: np.ndarray, cu: np.ndarray, tp_size: int,
                   one_row: bool) -> Callable[[], None]:
        """The replay of the graph this batch takes: the one graph, or its tier's."""
        return self.replays[self._tier(idx, cu, tp_size, one_row)]

    def _tier(self, idx, cu, tp_size: int, one_row: bool) -> int:
        if self.key is not None:
            return 0
        return self.tiers.index(pick_tier(self.tiers, busiest_owner_rows(idx, cu, tp_size, one_row)))


def unmasked(key: tuple) -> tuple:
    """The key of `key`'s step without bitmask support."""
    return (*key, NO_BITMASK)


def is_unmasked(key: tuple) -> bool:
    return key[-1] == NO_BITMASK


def keys_for(bucket: int, strategy: str, tiers: tuple[int, ...] | None) -> list[tuple]:
    """Every graph key of a bucket under a strategy (one per capacity tier for shard)."""
    if strategy == REPLICATE:
        return [(bucket, REPLICATE, 0)]
    return [(bucket, SHARD, c) for c in tiers]


def eager_key(n: int, idx: np.ndarray, cu: np.ndarray, strategy: str, tp_size: int) -> tuple:
    """The key of an uncaptured step: its exact size, and for shard its exact capacity."""
    size = max(n, 1)
    if strategy == REPLICATE:
        return (size, REPLICATE, 0)
    return (size, SHARD, max(1, busiest_owner_rows(idx, cu, tp_size, one_row=False)))


def eager_keys(max_bucket: int, max_num_reqs: int, strategies: tuple[str, ...],
               tp_size: int) -> list[tuple]:
    """Keys whose sampler calls cover every step above the largest bucket (`eager_key`): each
    size for replicate; for shard each capacity, which alone sizes its sampler call, from the
    least a step of more than `max_bucket` rows spread over `tp_size` owners can take."""
    if max_bucket >= max_num_reqs:
        return []
    keys = []
    for strategy in strategies:
        if strategy == SHARD:
            least = -(-(max_bucket + 1) // tp_size)
            keys += [(max_num_reqs, SHARD, c) for c in range(least, max_num_reqs + 1)]
        else:
            keys += [(n, REPLICATE, 0) for n in range(max_bucket + 1, max_num_reqs + 1)]
    return keys


def busiest_owner_rows(idx: np.ndarray, cu: np.ndarray, tp_size: int, one_row: bool) -> int:
    """The most logits rows any owner rank (`owner_ranks`) receives."""
    if idx.shape[0] == 0:
        return 0
    if one_row:  # rows are requests: one bincount on the step's host path
        return int(np.bincount(owner_ranks(idx, tp_size), minlength=tp_size).max())
    return int(owner_counts(idx, cu, tp_size)[1].max())
