"""Per-request sampling parameters and the per-slot device tables that hold them."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from graphshard.errors import InvalidParamsError, InvalidSlotError, InvalidTypeError, shown

_F32_MAX = float(np.finfo(np.float32).max)
# The sampler scores a row as fp32 logit / temperature. From this temperature up the scores stay
# finite for |logit| < 3.4e8, far beyond what an LM head emits; below it ever smaller logits
# overflow to +-inf (all above 3.4 at 1e-38) and the row samples an arbitrary token. Greedy
# sampling is temperature 0.
MIN_TEMPERATURE = 1e-30


def _number(field: str, value, integer: bool):
    """`value` as a plain int or float, or InvalidTypeError naming the field (bools are refused: a
    flag passed by mistake would otherwise read as 0 or 1)."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kind):
        raise InvalidTypeError(f"SamplingParams.{field} = {shown(value)}: must be "
                        f"{'an integer' if integer else 'a real number'}, got {type(value).__name__}")
    if integer:
        return int(value)
    try:
        out = float(value)
    except OverflowError:  # an int beyond the float range
        out = math.inf
    if not math.isfinite(out):
        raise InvalidParamsError(f"SamplingParams.{field} = {shown(value)}: must be finite")
    if out == 0.0 and value != 0:
        # Below float64's range (a Fraction, a long double): 0 would mean greedy or filter off.
        raise InvalidParamsError(f"SamplingParams.{field} = {shown(value)}: is nonzero but "
                                 f"rounds to 0 as a float")
    return out


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy. top_k <= 0, top_p >= 1 and min_p <= 0 switch a filter off.

    Fields are stored as plain Python numbers (NumPy scalars are converted), and every accepted
    value is one the fp32/int32 slot tables hold exactly as meant: no overflow to inf, no
    rounding of a positive temperature or top_p to 0, no nonzero value (a tiny Fraction, a long
    double) stored as float 0.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    num_logprobs: int = 0

    def __post_init__(self):
        def bad(field, why):
            raise InvalidParamsError(f"SamplingParams.{field} = {shown(getattr(self, field))}: {why}")
        for field, integer in (("temperature", False), ("top_k", True), ("top_p", False),
                               ("min_p", False), ("seed", True), ("num_logprobs", True)):
            object.__setattr__(self, field, _number(field, getattr(self, field), integer))
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= _F32_MAX):
            bad("temperature", f"must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {_F32_MAX:.4g}] "
                               f"(fp32 scores logit / temperature must stay finite)")
        if not (-2**31 <= self.top_k < 2**31):
            bad("top_k", "must be an int32 integer")
        if not (0.0 < self.top_p <= 1.0) or np.float32(self.top_p) == 0.0:
            bad("top_p", "must be in (0, 1] and not round to 0 in float32")
        if not (0.0 <= self.min_p <= 1.0):
            bad("min_p", "must be in [0, 1]")
        if not (0 <= self.seed < 2**63):
            bad("seed", "must be an integer in [0, 2**63)")
        if not (0 <= self.num_logprobs < 2**31):
            bad("num_logprobs", "must be an int32 integer >= 0")


# Columns of the packed slot table: one int32 row per slot, floats stored as their bits, so a
# kernel takes the whole table as one pointer and loads a slot's parameters from one row.
SLOT_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed_lo", "seed_hi", "num_logprobs")
SLOT_WIDTH = 8  # a power of two: one aligned row per slot
_FLOAT_FIELDS = ("temperature", "top_p", "min_p")


class SlotTables:
    """Device table indexed by request slot. Written outside the captured step, read inside it.

    `packed` [max_num_slots, SLOT_WIDTH] int32 holds every field (`SLOT_FIELDS` order, float
    fields as fp32 bits); the named attributes are strided views of its columns."""

    def __init__(self, max_num_slots: int, device: torch.device | str):
        self.max_num_slots = max_num_slots
        self.packed = torch.zeros(max_num_slots, SLOT_WIDTH, dtype=torch.int32, device=device)
        self.top_p.fill_(1.0)

    def __getattr__(self, name: str) -> torch.Tensor:
        if name in SLOT_FIELDS:
            column = self.packed[:, SLOT_FIELDS.index(name)]
            return column.view(torch.float32) if name in _FLOAT_FIELDS else column
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def set(self, slot: int, params: SamplingParams) -> None:
        """Write a slot's parameters in one copy (validated by SamplingParams, so no write can
        fail halfway)."""
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)):
            raise InvalidTypeError(f"slot must be an integer, got {type(slot).__name__} ({slot!r})")
        if not (0 <= slot < self.max_num_slots):
            raise InvalidSlotError(f"slot {slot!r} out of range [0, {self.max_num_slots})")
        if not isinstance(params, SamplingParams):
            raise InvalidTypeError(f"params must be SamplingParams, got {type(params).__name__}")
        self.packed[slot] = torch.from_numpy(pack_params(params))


def pack_params(params: SamplingParams) -> np.ndarray:
    """One slot-table row [SLOT_WIDTH] int32 for `params`."""
    # Imported here: graphshard.sample.rng holds Triton device functions, and SamplingParams is part of
    # the light top-level API (see graphshard/__init__.py).
    from graphshard.sample.rng import split_seed

    row = np.zeros(SLOT_WIDTH, dtype=np.int32)
    values = dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                  min_p=params.min_p, num_logprobs=params.num_logprobs)
    values["seed_lo"], values["seed_hi"] = split_seed(params.seed)
    for i, name in enumerate(SLOT_FIELDS):
        if name in _FLOAT_FIELDS:
            row[i] = np.float32(values[name]).view(np.int32)
        else:
            row[i] = values[name]
    return row
