"""The transport interface: move logits rows to their owners and gather per-request records back.

Every method that runs inside a captured step is graph-safe: it touches only buffers allocated in
`setup`, takes varying counts from the plan's device tensors and never syncs with the host. The
host-side arguments (capacities, `num_out`, `num_rows`) are static per captured bucket.

`exchange` and `all_gather_vocab` share the transport's receive buffer (the p2p transport always
lands rows there, then copies to `out` if given): their rows stay valid until the next call of
either. Records returned by `gather` stay valid until the next `gather`.

A step ends with `gather` (shard) or `close` (replicate); both take `done`, the step's done signal
(`graphshard.plan.staging.Staging`), which they raise once the step's results are in place. A push
that directly follows such a step end on every rank may pass `fenced=False`: the step end already
waited for every peer to finish reading what it was sent, so the p2p transport skips the push's
start barrier. Transports that need no such barrier ignore `fenced`.

`agree` (a `graphshard.engine.divergence.DivergenceCheck`, or None) is the step's divergence
check: the step's push (`exchange`, `all_gather_vocab`) and its end (`gather`, `close`) take the
same one, and the transport exchanges every rank's digest and has it judged before raising
`done`. A transport whose `gather` carries the digests in the records (`digest_rows` > 0) needs that many
rows past `capacity_reqs` in `records`, and its gathered records then sit `capacity_reqs +
digest_rows` rows apart per rank (the plan's `gather_stride`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from datetime import timedelta

import torch
import torch.distributed as dist

from graphshard.transports.digest import DIGEST_INT32
from graphshard.runtime.devices import resolve_device
from graphshard.plan.layout import PlanBuffers

# torch >= 2.13 names the fixed-size all-gather `all_gather_single`; older releases only have
# `all_gather_into_tensor` (same semantics, deprecated later).
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def finish(work, device: torch.device, timeout: timedelta) -> None:
    """Complete an async collective. gloo: wait at most `timeout` (a dead peer fails it at once,
    a silent one at the bound). NCCL: order the stream after it; its waits are bounded by the
    group's watchdog when eager and by the engine's step watchdog inside graphs."""
    if device.type == "cpu":
        work.wait(timeout=timeout)
    else:
        work.wait()


# First padded tier: the even split plus 25% headroom, so a batch whose owners are a little
# unbalanced still fits the smallest tier instead of paying for the next doubling.
_FIRST_TIER_HEADROOM = 1.25
_TIER_ALIGN = 8


def doubling_tiers(bucket_rows: int, tp_size: int) -> tuple[int, ...]:
    """Ascending per-destination capacities for a bucket of `bucket_rows` rows: the even split with
    headroom rounded up to a multiple of 8, doubled, ..., capped at `bucket_rows` (always last)."""
    if bucket_rows < 1:
        raise ValueError(f"bucket_rows must be >= 1, got {bucket_rows}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    tier = math.ceil(bucket_rows * _FIRST_TIER_HEADROOM / tp_size)
    tier = -(-tier // _TIER_ALIGN) * _TIER_ALIGN
    tiers = []
    while tier < bucket_rows:
        tiers.append(tier)
        tier *= 2
    tiers.append(bucket_rows)
    return tuple(tiers)


def pick_tier(tiers: tuple[int, ...], max_owner_rows: int) -> int:
    """Smallest tier >= `max_owner_rows` (tiers ascending)."""
    if max_owner_rows < 0 or max_owner_rows > tiers[-1]:
        raise ValueError(f"max_owner_rows must be in [0, {tiers[-1]}], got {max_owner_rows}")
    return next(t for t in tiers if t >= max_owner_rows)


class Transport(ABC):
    """One TP group's logits exchange and record gather. Call `setup` once before any step."""

    name: str = "base"
    digest_rows: int = 0  # record rows a checked `gather` carries the digest in (see above)

    def __init__(self, group: dist.ProcessGroup | None, device: torch.device | str, *,
                 timeout_s: float = 60.0):
        """`timeout_s` bounds every wait on a peer that the transport itself can bound."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed must be initialized before creating a transport")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s < 1e9:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._wait_timeout = timedelta(seconds=self.timeout_s)
        self.group = group if group is not None else dist.group.WORLD
        self.device = resolve_device(device)
        self.tp_rank = dist.get_rank(self.group)
        self.tp_size = dist.get_world_size(self.group)
        self.is_setup = False

    # -- setup ------------------------------------------------------------------------------
    def setup(self, *, max_num_rows: int, max_num_reqs: int, vocab_shard: int,
              logits_dtype: torch.dtype, record_width: int, device: torch.device | str | None = None):
        """Allocate every static buffer and warm the communicators (before any graph capture)."""
        if self.is_setup:
            raise RuntimeError("setup() runs once: captured graphs hold its buffers")
        if device is not None and resolve_device(device) != self.device:
            raise ValueError(f"setup device {device} differs from the transport's {self.device}")
        for field, value in (("max_num_rows", max_num_rows), ("max_num_reqs", max_num_reqs),
                             ("vocab_shard", vocab_shard), ("record_width", record_width)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
        if not isinstance(logits_dtype, torch.dtype) or not logits_dtype.is_floating_point:
            raise TypeError(f"logits_dtype must be a floating torch.dtype, got {logits_dtype!r}")
        self.max_num_rows = max_num_rows
        self.max_num_reqs = max_num_reqs
        self.vocab_shard = vocab_shard
        self.vocab = vocab_shard * self.tp_size
        self.logits_dtype = logits_dtype
        self.record_width = record_width
        self._digest_send = torch.zeros(DIGEST_INT32, dtype=torch.int32, device=self.device)
        self._digest_all = torch.zeros(self.tp_size * DIGEST_INT32, dtype=torch.int32,
                                       device=self.device)
        self._allocate()
        self.is_setup = True
        return self

    @abstractmethod
    def _allocate(self) -> None: ...

    # -- capacities -------------------------------------------------------------------------
    def capacity_tiers(self, bucket_rows: int) -> tuple[int, ...]:
        """Ascending per-destination row capacities usable for a bucket of `bucket_rows` rows."""
        return doubling_tiers(bucket_rows, self.tp_size)

    def pick_capacity(self, bucket_rows: int, max_owner_rows: int) -> int:
        """Smallest tier holding `max_owner_rows` (a host count every rank derives identically)."""
        return pick_tier(self.capacity_tiers(bucket_rows), max_owner_rows)

    # -- the step ---------------------------------------------------------------------------
    @abstractmethod
    def exchange(self, plan: PlanBuffers, logits_shard: torch.Tensor, out: torch.Tensor | None,
                 capacity: int, *, fenced: bool = True, agree=None) -> torch.Tensor:
        """Give each owner full-vocabulary rows: `out[j] = concat_s(shard_s[plan.local_row_src[j]])`
        for j < plan.local_num_rows. Returns the tensor holding them (`out`, or the transport's
        receive buffer when `out` is None)."""

    @abstractmethod
    def gather(self, plan: PlanBuffers, records: torch.Tensor, out: torch.Tensor | None,
               capacity_reqs: int, num_out: int, *, done=None, agree=None) -> torch.Tensor:
        """All ranks end with `out[i]` = the owner's record of batch request i, for i < num_out.
        Returns the tensor holding them (`out`, or the transport's output buffer). Ends a step:
        raises `done` (if given) once the records are in place."""

    @abstractmethod
    def all_gather_vocab(self, logits_shard: torch.Tensor, out: torch.Tensor | None,
                         num_rows: int, *, fenced: bool = True, agree=None) -> torch.Tensor:
        """Every rank gets full-vocabulary rows `out[:num_rows]` (vocab blocks in rank order)."""

    def close(self, done=None, agree=None) -> None:
        """End a step that has no `gather` (replicate), after its last read of the rows: judges
        `agree` and raises `done` (if given). p2p adds a barrier."""
        self._check_ready()
        if agree is not None:
            self.agree(agree, done)
        elif done is not None:
            done.signal_done()

    def agree(self, check, done=None) -> None:
        """Exchange and judge the step's digests in a step without a record gather (replicate;
        graph-safe): one all-gather of 32 bytes per rank; the judge ends the step if `done` is
        given. A padded gather carries them with the records; p2p pushes them with its rows."""
        check.seal_on_device(self._digest_send)
        finish(all_gather_single(self._digest_all, self._digest_send, group=self.group,
                                 async_op=True), self.device, self._wait_timeout)
        check.judge_gathered(self._digest_all, DIGEST_INT32, done)

    @abstractmethod
    def barrier(self) -> None: ...

    def fault(self) -> str | None:
        """Why the transport gave up on a peer (it is then broken for good), or None. Collective
        errors raise instead; transports whose device-side waits give up on their own say so here."""
        return None

    @abstractmethod
    def receive_buffer(self) -> torch.Tensor:
        """[max_num_rows, vocab] the static buffer `exchange(..., out=None)` fills."""

    @abstractmethod
    def output_buffer(self) -> torch.Tensor:
        """[max_num_reqs, record_width] int32, the static buffer `gather(..., out=None)` fills."""

    # -- checks (host-side, static properties only) -----------------------------------------
    def _check_ready(self):
        if not self.is_setup:
            raise RuntimeError(f"{type(self).__name__}.setup() must run before the first step")

    def _check_logits(self, logits_shard: torch.Tensor, num_rows: int | None = None):
        self._check_ready()
        if not isinstance(logits_shard, torch.Tensor):
            raise TypeError(f"logits_shard must be a tensor, got {type(logits_shard).__name__}")
        if logits_shard.dtype != self.logits_dtype:
            raise TypeError(f"logits_shard must be {self.logits_dtype}, got {logits_shard.dtype}")
        if logits_shard.device != self.device:
            raise ValueError(f"logits_shard must be on {self.device}, got {logits_shard.device}")
        if logits_shard.dim() != 2 or logits_shard.shape[1] != self.vocab_shard:
            raise ValueError(f"logits_shard must be [rows, {self.vocab_shard}], "
                             f"got {tuple(logits_shard.shape)}")
        if logits_shard.stride(1) != 1:
            raise ValueError("logits_shard must have contiguous columns (stride(1) == 1)")
        need = max(1, num_rows or 0)
        if logits_shard.shape[0] < need:
            raise ValueError(f"logits_shard has {logits_shard.shape[0]} rows, needs >= {need}")

    def _check_rows_out(self, out: torch.Tensor | None, rows: int, what: str = "capacity"):
        if not 0 <= rows <= self.max_num_rows:
            raise ValueError(f"{what} must be in [0, max_num_rows={self.max_num_rows}], got {rows}")
        if out is None:
            return
        if out.dtype != self.logits_dtype or out.device != self.device:
            raise TypeError(f"out must be {self.logits_dtype} on {self.device}, "
                            f"got {out.dtype} on {out.device}")
        if out.dim() != 2 or out.shape[1] != self.vocab or out.shape[0] < rows:
            raise ValueError(f"out must be [>= {rows}, {self.vocab}], got {tuple(out.shape)}")
        if out.stride(1) != 1:
            raise ValueError("out must have contiguous columns (stride(1) == 1)")

    def _check_records(self, records: torch.Tensor, out: torch.Tensor | None, capacity_reqs: int,
                       num_out: int, extra_rows: int = 0):
        self._check_ready()
        if not 0 <= num_out <= self.max_num_reqs:
            raise ValueError(f"num_out must be in [0, max_num_reqs={self.max_num_reqs}], got {num_out}")
        if not 1 <= capacity_reqs <= self.max_num_reqs:
            raise ValueError(f"capacity_reqs must be in [1, max_num_reqs={self.max_num_reqs}], "
                             f"got {capacity_reqs}")
        for name, t, rows in (("records", records, capacity_reqs + extra_rows), ("out", out, num_out)):
            if t is None:
                continue
            if t.dtype != torch.int32 or t.device != self.device:
                raise TypeError(f"{name} must be int32 on {self.device}, got {t.dtype} on {t.device}")
            if t.dim() != 2 or t.shape[1] != self.record_width or t.shape[0] < rows:
                raise ValueError(f"{name} must be [>= {rows}, {self.record_width}], "
                                 f"got {tuple(t.shape)}")
            if t.stride(1) != 1:
                raise ValueError(f"{name} must have contiguous columns (stride(1) == 1)")

    def _check_plan(self, plan: PlanBuffers):
        if plan.tp_size != self.tp_size:
            raise ValueError(f"plan is for tp_size {plan.tp_size}, transport has {self.tp_size}")
        if plan.send_rows.device != self.device:
            raise ValueError(f"plan must be on {self.device}, got {plan.send_rows.device}")
        # A plan larger than the static buffers could name rows past their end.
        if plan.max_num_reqs > self.max_num_reqs or plan.send_rows.shape[0] > self.max_num_rows:
            raise ValueError(f"plan holds up to {plan.max_num_reqs} requests / "
                             f"{plan.send_rows.shape[0]} rows; the transport was set up for "
                             f"{self.max_num_reqs} / {self.max_num_rows}")
