"""Per-request sampling parameters and the per-slot device tables that hold them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy. top_k <= 0, top_p >= 1 and min_p <= 0 switch a filter off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    num_logprobs: int = 0

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"SamplingParams.{field} = {getattr(self, field)!r}: {why}")
        if not (self.temperature >= 0.0) or self.temperature == float("inf"):
            bad("temperature", "must be finite and >= 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            bad("top_k", "must be an integer")
        if not (0.0 < self.top_p <= 1.0):
            bad("top_p", "must be in (0, 1]")
        if not (0.0 <= self.min_p <= 1.0):
            bad("min_p", "must be in [0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not (0 <= self.seed < 2**63):
            bad("seed", "must be an integer in [0, 2**63)")
        if isinstance(self.num_logprobs, bool) or not isinstance(self.num_logprobs, int) \
                or self.num_logprobs < 0:
            bad("num_logprobs", "must be an integer >= 0")


class SlotTables:
    """Device tables indexed by request slot. Written outside the captured step, read inside it."""

    def __init__(self, max_num_slots: int, device: torch.device | str):
        self.max_num_slots = max_num_slots
        f32 = dict(dtype=torch.float32, device=device)
        i32 = dict(dtype=torch.int32, device=device)
        self.temperature = torch.zeros(max_num_slots, **f32)  # [max_num_slots]
        self.top_k = torch.zeros(max_num_slots, **i32)
        self.top_p = torch.ones(max_num_slots, **f32)
        self.min_p = torch.zeros(max_num_slots, **f32)
        # Two 32-bit halves keep the RNG key arithmetic in uint32 on every backend.
        self.seed_lo = torch.zeros(max_num_slots, **i32)
        self.seed_hi = torch.zeros(max_num_slots, **i32)
        self.num_logprobs = torch.zeros(max_num_slots, **i32)

    def set(self, slot: int, params: SamplingParams) -> None:
        if not (0 <= slot < self.max_num_slots):
            raise ValueError(f"slot {slot} out of range [0, {self.max_num_slots})")
        lo = params.seed & 0xFFFFFFFF
        hi = (params.seed >> 32) & 0xFFFFFFFF
        # int32 storage of the uint32 halves: reinterpret, same bits.
        to_i32 = lambda u: u - (1 << 32) if u >= (1 << 31) else u  # noqa: E731
        self.temperature[slot] = params.temperature
        self.top_k[slot] = params.top_k
        self.top_p[slot] = params.top_p
        self.min_p[slot] = params.min_p
        self.seed_lo[slot] = to_i32(lo)
        self.seed_hi[slot] = to_i32(hi)
        self.num_logprobs[slot] = params.num_logprobs
