"""A simulated decode loop: requests arrive and finish, slots churn, batches cross buckets.

Every rank builds the same workload from the same seed, as a real scheduler's replicated state
would be. Used by the demo, the end-to-end tests and the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from graphshard.config import Config
from graphshard.sample.kernels import bitmask_words
from graphshard.sample.params import SamplingParams


@dataclass
class Batch:
    """One step's replicated inputs, as host arrays, plus the request churn before it."""

    idx_mapping: np.ndarray  # [n] int32
    cu_num_logits: np.ndarray  # [n+1] int32
    seq_lens: np.ndarray  # [n] int32
    draft_token_ids: np.ndarray | None  # [num_logits] int32
    grammar_bitmask: np.ndarray | None  # [num_logits, ceil(V/32)] int32
    added: list[tuple[int, SamplingParams]] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return self.idx_mapping.shape[0]

    @property
    def num_logits(self) -> int:
        return int(self.cu_num_logits[-1])


@dataclass
class _Request:
    slot: int
    params: SamplingParams
    seq_len: int
    remaining: int
    constrained: bool
    allowed: np.ndarray | None  # the grammar's allowed token ids


def bitmask_from_allowed(allowed: np.ndarray | None, vocab_size: int) -> np.ndarray:
    """One int32 bitmask row (bit t%32 of word t//32) allowing `allowed`, or everything."""
    words = bitmask_words(vocab_size)
    if allowed is None:
        return np.full(words, -1, dtype=np.int32)
    bits = np.zeros(words * 32, dtype=np.uint8)
    bits[allowed] = 1
    packed = np.packbits(bits.reshape(words, 32)[:, ::-1], axis=1, bitorder="big")
    return packed.view(">u4").astype(np.uint32).view(np.int32).reshape(words)


class Workload:
    """Deterministic request churn. `next_batch()` returns the inputs of the next decode step."""

    def __init__(self, cfg: Config, seed: int = 0, *, max_batch: int | None = None,
                 grammar: bool | None = None, spec: bool = True, nan_rate: float = 0.002):
        """`grammar`: some requests are constrained by a grammar bitmask (by default when the
        config's `grammar_bitmask` allows it); `spec`: requests verify drafts (when the config
        has more than one logits row per request)."""
        if grammar is None:
            grammar = cfg.grammar_bitmask
        elif grammar and not cfg.grammar_bitmask:
            raise ValueError("grammar=True needs a config with grammar_bitmask = true")
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.max_batch = min(max_batch or cfg.max_num_reqs, cfg.max_num_reqs)
        self.grammar = grammar
        self.spec = spec and cfg.max_num_logits_per_req > 1
        self.nan_rate = nan_rate
        self.free_slots = list(range(cfg.max_num_slots))
        self.running: list[_Request] = []
        self.step_index = 0
        self.target = 1
        self._before_burst = 1

    def _params(self) -> SamplingParams:
        r = self.rng
        kind = r.choice(["greedy", "temperature", "top_k", "top_p", "min_p", "all"])
        # Logprobs on a minority of requests, as in serving (they cost extra passes over the row).
        k = int(r.integers(1, self.cfg.num_logprobs + 1)) if self.cfg.num_logprobs and r.random() < 0.15 else 0
        seed = int(r.integers(0, 2**63 - 1))
        if kind == "greedy":
            return SamplingParams(temperature=0.0, seed=seed, num_logprobs=k)
        t = float(r.uniform(0.3, 1.5))
        return SamplingParams(
            temperature=t,
            top_k=int(r.integers(1, 50)) if kind in ("top_k", "all") else 0,
            top_p=float(r.uniform(0.5, 0.95)) if kind in ("top_p", "all") else 1.0,
            min_p=float(r.uniform(0.01, 0.2)) if kind in ("min_p", "all") else 0.0,
            seed=seed, num_logprobs=k)

    def _admit(self) -> list[tuple[int, SamplingParams]]:
        added = []
        while len(self.running) < self.target and self.free_slots:
            # Lowest free slot first, as a slot allocator filling from the bottom does.
            self.free_slots.sort()
            slot = self.free_slots.pop(0)
            constrained = self.grammar and self.rng.random() < 0.2
            allowed = None
            if constrained:
                size = int(self.rng.integers(1, max(2, self.cfg.vocab_size // 20)))
                allowed = self.rng.choice(self.cfg.vocab_size, size=size, replace=False)
            req = _Request(slot, self._params(), int(self.rng.integers(1, 2048)),
                           int(self.rng.integers(1, 40)), constrained, allowed)
            self.running.append(req)
            added.append((slot, req.params))
        return added

    def _retire(self) -> list[int]:
        done = [r for r in self.running if r.remaining <= 0]
        self.running = [r for r in self.running if r.remaining > 0]
        for r in done:
            self.free_slots.append(r.slot)
        return [r.slot for r in done]

    def next_batch(self) -> Batch:
        # Random walk of the batch size over the whole range, jumps included, so steps cross
        # bucket edges and sometimes exceed the largest bucket.
        if self.step_index % 16 == 10:  # a one-step burst to the largest batch
            self._before_burst, self.target = self.target, self.max_batch
        elif self.step_index % 16 == 11:
            self.target = self._before_burst
        elif self.rng.random() < 0.15:
            self.target = int(self.rng.integers(0, self.max_batch + 1))
        else:
            self.target = int(np.clip(self.target + self.rng.integers(-3, 4), 0, self.max_batch))
        removed = self._retire()
        while len(self.running) > self.target:  # preemption
            r = self.running.pop(int(self.rng.integers(0, len(self.running))))
            self.free_slots.append(r.slot)
            removed.append(r.slot)
        added = self._admit()
        order = self.rng.permutation(len(self.running))
        reqs = [self.running[i] for i in order]
        max_m = self.cfg.max_num_logits_per_req if self.spec else 1
        counts = self.rng.integers(1, max_m + 1, size=len(reqs))
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        num_logits = int(cu[-1])
        drafts = None
        if self.spec:
            drafts = self.rng.integers(0, self.cfg.vocab_size, size=num_logits).astype(np.int32)
        bitmask = None
        if any(r.constrained for r in reqs):
            bitmask = np.stack([bitmask_from_allowed(r.allowed, self.cfg.vocab_size)
                                for r, m in zip(reqs, counts) for _ in range(m)])
        for r, m in zip(reqs, counts):
            r.seq_len += int(m)
            r.remaining -= 1
        self.step_index += 1
        return Batch(
            idx_mapping=np.array([r.slot for r in reqs], dtype=np.int32),
            cu_num_logits=cu,
            seq_lens=np.array([r.seq_len for r in reqs], dtype=np.int32),
            draft_token_ids=drafts, grammar_bitmask=bitmask, added=added, removed=removed)

    def logits(self, batch: Batch, padded_vocab: int, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> torch.Tensor:
        """Full-vocabulary logits [num_logits, padded_vocab] for a batch, made on `device`.

        Drafts get a boost on most rows so speculative verification accepts some of them; a
        few rows carry a NaN; the padded columns hold large values that must never be sampled.
        """
        device = torch.device(device)
        g = torch.Generator(device).manual_seed(self.seed * 1_000_003 + self.step_index)
        n = batch.num_logits
        x = torch.randn(n, padded_vocab, generator=g, device=device) * 2.0
        x[:, self.cfg.vocab_size:] = 1e4
        if batch.draft_token_ids is not None and n:
            rows = torch.arange(n, device=device)
            boost = (torch.rand(n, generator=g, device=device) < 0.7).float() * 12.0
            x[rows, torch.from_numpy(batch.draft_token_ids).long().to(device)] += boost
        if self.nan_rate and n:
            nan_rows = torch.rand(n, generator=g, device=device) < self.nan_rate
            cols = torch.randint(0, self.cfg.vocab_size, (n,), generator=g, device=device)
            x[nan_rows, cols[nan_rows]] = float("nan")
        return x.to(dtype)
