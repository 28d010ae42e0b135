"""Per-bucket graphs: capture every key largest first into the backend's shared pool, replay by key.

A graph key is a bucket (a batch size) or a tuple whose first entry is the bucket, e.g.
`(bucket, strategy, capacity)` as the engine uses. Keys are hashable and sortable; capture runs
in descending order so the largest graph sizes the shared pool and the smaller ones reuse it. A batch of `n` requests
replays the smallest bucket `>= n`; above the largest bucket the step runs eagerly, or the
manager refuses it before anything (collectives included) has run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Protocol, Sequence

from graphshard.config import FALLBACKS, bucket_problem
from graphshard.errors import BatchTooLargeError


class GraphBackend(Protocol):
    """What the manager needs from a graph backend (CudaGraphBackend, EmulatedGraphBackend)."""

    name: str

    def warmup(self, fn: Callable[[], Any], iters: int = ...) -> None: ...
    def capture(self, key: Hashable, fn: Callable[[], Any]) -> Any: ...
    def replay(self, key: Hashable) -> Any: ...
    def replayer(self, key: Hashable) -> Callable[[], Any]: ...
    def memory_bytes(self) -> int | None: ...


@dataclass(frozen=True)
class GraphStats:
    replays: dict  # key -> number of replays
    eager_fallbacks: int
    capture_s: dict  # key -> seconds spent warming up and capturing that key
    capture_total_s: float
    graph_memory_bytes: int | None  # None where the backend holds no device memory


def bucket_of(key) -> int:
    """The batch size a graph key serves."""
    return key[0] if isinstance(key, tuple) else key


def build_bucket_table(buckets: Sequence[int]) -> list[int]:
    """table[n] = smallest bucket >= n, for 0 <= n <= max bucket."""
    table = []
    for b in buckets:
        table.extend([b] * (b + 1 - len(table)))
    return table


def _check_buckets(buckets) -> tuple[int, ...]:
    buckets = tuple(buckets)
    problem = bucket_problem(buckets)
    if problem is not None:
        raise ValueError(f"buckets {buckets!r}: {problem}")
    return buckets


class GraphManager:
    """Captures one graph per key through a backend and dispatches batches to them."""

    def __init__(self, backend: GraphBackend, buckets: Iterable[int], *, fallback: str = "eager",
                 barrier: Callable[[], Any] | None = None, warmup_iters: int = 2):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACKS)}, got {fallback!r}")
        if warmup_iters < 1:
            raise ValueError(f"warmup_iters must be >= 1, got {warmup_iters}")
        self.backend = backend
        self.buckets = _check_buckets(buckets)
        self.fallback = fallback
        self.barrier = barrier
        self.warmup_iters = warmup_iters
        self._table = build_bucket_table(self.buckets)
        self._replays: dict[Hashable, list[int]] = {}  # key -> [replays]
        self._capture_s: dict[Hashable, float] = {}
        self._eager_fallbacks = 0

    @property
    def max_bucket(self) -> int:
        return self.buckets[-1]

    @property
    def keys(self) -> list:
        """Captured keys, in capture order (largest first)."""
        return list(self._capture_s)

    def bucket_for(self, n: int) -> int | None:
        """Smallest bucket >= n, or None when n exceeds the largest bucket."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        return self._table[n] if n < len(self._table) else None

    def capture(self, step_for: Callable[[Hashable], Callable[[], Any]], keys: Iterable | None = None):
        """Warm up and capture `step_for(key)` for every key, largest first.

        `barrier()` runs between consecutive keys so that every rank captures the same key at the
        same time (the collectives inside a step pair up across ranks during warmup).
        """
        keys = sorted(self.buckets if keys is None else keys, reverse=True)
        self._check_keys(keys)
        for i, key in enumerate(keys):
            if i and self.barrier is not None:
                self.barrier()
            fn = step_for(key)
            start = time.perf_counter()
            self.backend.warmup(fn, self.warmup_iters)
            self.backend.capture(key, fn)
            self._capture_s[key] = time.perf_counter() - start
            self._replays[key] = [0]

    def _check_keys(self, keys: list):
        if len(set(keys)) != len(keys):
            raise ValueError(f"graph keys must be unique, got {keys}")
        for key in keys:
            if key in self._capture_s:
                raise ValueError(f"a graph is already captured for key {key!r}")
            if bucket_of(key) not in self.buckets:
                raise ValueError(f"graph key {key!r} does not name one of the buckets {self.buckets}")

    def replay(self, key) -> Any:
        """Replay the graph of `key`; returns the backend's outputs for it."""
        self._count(key)[0] += 1
        return self.backend.replay(key)

    def replayer(self, key) -> Callable[[], None]:
        """What `replay(key)` does, as a call with the key looked up once (a step's hot path):
        launch the graph, count the replay; returns nothing."""
        count, launch = self._count(key), self.backend.replayer(key)

        def replay() -> None:
            count[0] += 1
            launch()

        return replay

    def _count(self, key) -> list[int]:
        try:
            return self._replays[key]
        except KeyError:
            raise KeyError(f"no graph captured for key {key!r}; captured: {self.keys}") from None

    def check_fits(self, n: int):
        """Raise BatchTooLargeError if `n` needs the eager path and the fallback is "error"."""
        if self.fallback == "error" and n > self.max_bucket:
            raise self._too_large(f"batch of {n} requests")

    def run_eager(self, fn: Callable[[], Any], n: int | None = None) -> Any:
        """Run the step without a graph (batch above the largest bucket); counts the fallback.

        With fallback "error" this raises before calling `fn`, so no collective has started.
        """
        if self.fallback == "error":
            raise self._too_large("a batch" if n is None else f"a batch of {n} requests")
        self._eager_fallbacks += 1
        return fn()

    def _too_large(self, what: str) -> BatchTooLargeError:
        return BatchTooLargeError(
            f"{what} exceeds the largest captured bucket ({self.max_bucket}) and fallback is "
            f"'error'; raise max_num_reqs/buckets or use fallback='eager'")

    def stats(self) -> GraphStats:
        return GraphStats(
            replays={key: count[0] for key, count in self._replays.items()},
            eager_fallbacks=self._eager_fallbacks,
            capture_s=dict(self._capture_s),
            capture_total_s=sum(self._capture_s.values()),
            graph_memory_bytes=self.backend.memory_bytes(),
        )
