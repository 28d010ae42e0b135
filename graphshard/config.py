"""Engine configuration: one frozen dataclass, validated on construction, loaded from TOML."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from graphshard.errors import ConfigError

# The allowed values of the config's choice fields, listed once: the modules that build from a
# field (graph backends, strategies, the bucket manager) import them from here.
LOGITS_DTYPES = ("float32", "bfloat16", "float16")
TRANSPORTS = ("p2p", "nccl", "gloo", "auto")
GRAPH_BACKENDS = ("cuda", "emulated", "auto")
SHARD, REPLICATE = "shard", "replicate"
STRATEGIES = (SHARD, REPLICATE, "auto")
FALLBACKS = ("eager", "error")


def default_buckets(max_bucket: int) -> tuple[int, ...]:
    """vLLM-style capture sizes: 1, 2, 4, then steps of 8 to 256, 16 to 512, 32 beyond."""
    if max_bucket < 1:
        raise ConfigError(f"max_bucket must be >= 1, got {max_bucket!r}")
    sizes = [1, 2, 4]
    sizes += range(8, 256, 8)
    sizes += range(256, 512, 16)
    sizes += range(512, max_bucket + 1, 32)
    out = sorted({s for s in sizes if s <= max_bucket} | {max_bucket})
    return tuple(out)


def bucket_problem(buckets: tuple) -> str | None:
    """What is wrong with a tuple of capture batch sizes, or None: the one bucket rule, applied by
    `Config` and by `graphshard.graphs.GraphManager`."""
    if not buckets:
        return "must hold at least one batch size"
    for b in buckets:
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            return f"entry {b!r} is not a positive integer"
    if list(buckets) != sorted(set(buckets)):
        return "must be strictly increasing"
    return None


def _fail(field: str, value, why: str):
    raise ConfigError(f"config field '{field}' = {value!r}: {why}")


def _check_int(field: str, value, lo: int):
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(field, value, "must be an integer")
    if value < lo:
        _fail(field, value, f"must be >= {lo}")


def _check_choice(field: str, value, choices):
    if value not in choices:
        _fail(field, value, f"must be one of {', '.join(choices)}")


@dataclass(frozen=True)
class Config:
    vocab_size: int
    max_num_reqs: int
    max_num_logits_per_req: int = 1
    max_num_slots: int | None = None
    logits_dtype: str = "float32"
    # Vocab-parallel heads pad the vocabulary to a multiple of this times the TP size.
    vocab_pad_multiple: int = 64
    buckets: tuple[int, ...] | None = None
    transport: str = "auto"
    graph_backend: str = "auto"
    strategy: str = "shard"
    fallback: str = "eager"
    num_logprobs: int = 0
    # Whether steps may pass a grammar bitmask. An engine without (false) runs and compiles only
    # the sampler's variants without bitmask support: one scan launch a step instead of two (the
    # bitmask-capable one returns at once on a step without a bitmask), a finish with fewer
    # registers, no bitmask buffer, fewer variants to compile at the first capture. A step
    # given a bitmask then raises InvalidBatchError.
    grammar_bitmask: bool = True
    # With grammar_bitmask at tp = 1 (and the built-in sampler): also capture every bucket
    # without bitmask support, and replay that graph for steps given no bitmask, so they run
    # as an engine with grammar_bitmask = false would (on an H100 at V = 32000 bf16, batch 1,
    # top-k + top-p: 34.8 against 36.0 µs a step with one graph a bucket; the engine without
    # bitmask support took 28.1 against 30.5 on a faster host; BENCHMARKS.md). The price: twice
    # the graphs, and both kinds of sampler variants to compile at capture (5 variants in 225 s
    # against 3 in 145 s on an H100 host's 16 cores, cold cache). Ignored at tp > 1, where the
    # exchange outweighs the launch it saves.
    bitmask_free_graphs: bool = True
    # Launch the sampler's kernels (and at tp = 1 the step's last kernel) as programmatic
    # dependents of the kernel before each, where the GPU can (compute capability 9.0+;
    # `graphshard.runtime.pdl`): each may be scheduled while its predecessor finishes and waits
    # for it before touching memory, so the results are the same and the gaps between kernels
    # shorter. Ignored on other devices (`Engine.programmatic_launch` says what applies). On by
    # default: on an H100 at 32000 bf16 the step was faster at 21 of the 22 points timed
    # (batches 1 to 1024) and 1 µs slower at one (BENCHMARKS.md).
    programmatic_launch: bool = True
    # Seconds a rank waits for a peer before the step fails (p2p barriers, gloo collectives);
    # a CUDA step still running after twice this is aborted.
    timeout_s: float = 60.0
    # Debug: hash the replicated inputs and slot-table history every step and compare them across
    # ranks through one small collective, so diverging ranks raise instead of sampling garbage.
    check_agreement: bool = False
    # Compare a digest of each step's replicated inputs, slot tables and step count across ranks
    # inside the captured step (a few bytes with the exchange); a step where the ranks diverged
    # raises RankDivergenceError on every rank instead of returning wrong tokens.
    divergence_check: bool = True

    def __post_init__(self):
        _check_int("vocab_size", self.vocab_size, 2)
        _check_int("max_num_reqs", self.max_num_reqs, 1)
        _check_int("max_num_logits_per_req", self.max_num_logits_per_req, 1)
        if self.max_num_slots is None:
            object.__setattr__(self, "max_num_slots", self.max_num_reqs)
        _check_int("max_num_slots", self.max_num_slots, 1)
        if self.max_num_slots < self.max_num_reqs:
            _fail("max_num_slots", self.max_num_slots,
                  f"must be >= max_num_reqs ({self.max_num_reqs}): every request needs its own slot")
        if self.max_num_slots >= 2**31:
            _fail("max_num_slots", self.max_num_slots, "must fit in int32")
        _check_choice("logits_dtype", self.logits_dtype, LOGITS_DTYPES)
        _check_int("vocab_pad_multiple", self.vocab_pad_multiple, 1)
        _check_choice("transport", self.transport, TRANSPORTS)
        _check_choice("graph_backend", self.graph_backend, GRAPH_BACKENDS)
        _check_choice("strategy", self.strategy, STRATEGIES)
        _check_choice("fallback", self.fallback, FALLBACKS)
        _check_int("num_logprobs", self.num_logprobs, 0)
        if self.num_logprobs > 64:
            _fail("num_logprobs", self.num_logprobs, "must be <= 64")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                or not 0 < self.timeout_s <= 86400:
            _fail("timeout_s", self.timeout_s, "must be a number of seconds in (0, 86400]")
        for field in ("grammar_bitmask", "bitmask_free_graphs", "programmatic_launch",
                      "check_agreement", "divergence_check"):
            if not isinstance(getattr(self, field), bool):
                _fail(field, getattr(self, field), "must be true or false")
        self._resolve_buckets()

    def _resolve_buckets(self):
        buckets = self.buckets
        if buckets is None:
            buckets = default_buckets(self.max_num_reqs)
        if isinstance(buckets, (str, bytes)) or not hasattr(buckets, "__iter__"):
            _fail("buckets", buckets, "must be a list of batch sizes")
        buckets = tuple(buckets)
        problem = bucket_problem(buckets)
        if problem is not None:
            _fail("buckets", buckets, problem)
        if buckets[-1] > self.max_num_reqs:
            _fail("buckets", buckets,
                  f"largest bucket {buckets[-1]} exceeds max_num_reqs ({self.max_num_reqs})")
        object.__setattr__(self, "buckets", buckets)

    @property
    def max_bucket(self) -> int:
        return self.buckets[-1]

    def padded_vocab_size(self, tp_size: int) -> int:
        """The vocabulary the LM head emits: a multiple of `vocab_pad_multiple * tp_size`."""
        unit = self.vocab_pad_multiple * tp_size
        return -(-self.vocab_size // unit) * unit

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        rule = data.pop("max_bucket", None)
        if data.get("buckets") == "default":
            data["buckets"] = default_buckets(rule if rule is not None else data.get("max_num_reqs", 0))
        elif isinstance(data.get("buckets"), str):
            _fail("buckets", data["buckets"], "must be a list of batch sizes or \"default\"")
        elif rule is not None:
            if "buckets" in data:
                _fail("max_bucket", rule, "only applies with buckets = \"default\"")
            data["buckets"] = default_buckets(rule)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        missing = [f for f in ("vocab_size", "max_num_reqs") if f not in data]
        if missing:
            raise ConfigError(f"missing required config field(s): {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> "Config":
        path = Path(path)
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        if "engine" not in data:
            raise ConfigError(f"{path}: no [engine] table")
        section = data["engine"]
        try:
            return cls.from_dict(section)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
