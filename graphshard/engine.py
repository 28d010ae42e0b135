"""The engine: what a decode loop holds. Static buffers, per-slot state, capture and `step()`.

A step on rank r (DESIGN section 1): plan -> exchange logits to their owners -> sample the owned
rows -> gather the per-request records to every rank in batch order. With `capture()` every
bucket runs as one graph replay; batches above the largest bucket run the same code eagerly.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from graphshard.agreement import AgreementCheck, digest
from graphshard.config import Config
from graphshard.devices import resolve_device
from graphshard.faults import FaultReporter, StepFault, Watchdog, default_store, describe
from graphshard.graphs import GraphManager, make_backend
from graphshard.inputs import StepInputs
from graphshard.params import SamplingParams, SlotTables
from graphshard.plan import plan
from graphshard.plan_layout import PlanBuffers
from graphshard.records import RecordLayout, SamplerOutput, unpack
from graphshard.sampler import SamplerWorkspace, sample
from graphshard.strategy import REPLICATE, SHARD, choose_strategies
from graphshard.transports.base import pick_tier
from graphshard.validate import BatchChecker, BatchLimits, InvalidBatchError, owner_counts

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

SAMPLER_CONTRACT = """A replacement sampler is a callable with the keyword signature of
`graphshard.sampler.sample`: `(logits, *, vocab_size, num_reqs, req_slots, cu_num_logits,
seq_lens, tables, layout, records, max_num_reqs, draft_tokens, bitmask, bitmask_rows,
bitmask_enabled)`. It runs inside the captured step, so it must:
- read the request count from `num_reqs` (int32 [1], device) and treat `max_num_reqs` as a static
  bound: no `.item()`, `.tolist()`, `.cpu()`, `nonzero` or Python branch on tensor values;
- write one packed record per request j < n into `records[j]` (`graphshard.records` layout) and
  allocate nothing that outlives the call;
- draw random tokens from (slot seed, position, token id) only, if the sharded result is to
  equal the unsharded one.
`graphshard.testing.check_graph_safe` (CPU, emulated graphs) checks a sampler against the first
two rules; an Engine built with it on the emulated backend refuses violations at capture."""


@dataclass(frozen=True)
class StepKey:
    """What selects a graph: the bucket, the strategy and (shard only) the exchange capacity."""

    bucket: int
    strategy: str
    capacity: int

    def as_key(self) -> tuple:
        return (self.bucket, self.strategy, self.capacity)


class Engine:
    """Batch-sharded sampling for one TP group. Every rank builds one with the same config."""

    def __init__(self, config: Config, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None, sampler=None):
        """`sampler` replaces the built-in Triton sampler; see `SAMPLER_CONTRACT`."""
        self.config = config
        self._user_sampler = sampler
        distributed = dist.is_available() and dist.is_initialized()
        self.group = group if group is not None else (dist.group.WORLD if distributed else None)
        self.tp_size = dist.get_world_size(self.group) if self.group is not None else 1
        self.tp_rank = dist.get_rank(self.group) if self.group is not None else 0
        self.device = resolve_device(device)
        self.vocab = config.padded_vocab_size(self.tp_size)
        self.vocab_shard = self.vocab // self.tp_size
        self.dtype = DTYPES[config.logits_dtype]
        self.layout = RecordLayout(config.max_num_logits_per_req, config.num_logprobs)
        self.checker = BatchChecker(
            BatchLimits(config.max_num_reqs, config.max_num_logits_per_req, config.max_num_slots))
        self._allocate()
        self.graphs = GraphManager(self.backend, config.buckets, fallback=config.fallback,
                                   barrier=self._barrier)
        self._strategy = {b: (REPLICATE if config.strategy == REPLICATE or self.tp_size == 1 else SHARD)
                          for b in config.buckets}
        self.captured = False
        self.eager_steps = 0
        self.steps = 0  # steps issued, the same count on every rank
        self._views: dict[int, SamplerOutput] = {}
        self._setup_faults()

    # -- set-up --------------------------------------------------------------------------------
    def _allocate(self) -> None:
        cfg, dev = self.config, self.device
        n, m = cfg.max_num_reqs, cfg.max_num_logits_per_req
        self.tables = SlotTables(cfg.max_num_slots, dev)
        self.inputs = StepInputs(max_num_reqs=n, max_num_logits_per_req=m, vocab_shard=self.vocab_shard,
                                 bitmask_words=-(-self.vocab // 32), logits_dtype=self.dtype, device=dev)
        self.plan_buffers = PlanBuffers.allocate(n, m, self.tp_size, dev)
        self.local_records = torch.zeros(n, self.layout.width, dtype=torch.int32, device=dev)
        # One workspace serves every graph: steps run one after another on one stream.
        self.workspace = SamplerWorkspace.allocate(n, m, cfg.vocab_size, dev)
        self.sample = self._user_sampler or functools.partial(sample, workspace=self.workspace)
        # Every logits row is its own bitmask row in batch order (replicate and tp=1 paths).
        self.identity_rows = torch.arange(n * m, dtype=torch.int32, device=dev)
        self.transport = None
        self._tiers: dict[int, tuple[int, ...]] = {}
        if self.tp_size > 1:
            from graphshard.transports import make_transport

            self.transport = make_transport(cfg.transport, self.group, dev, timeout_s=cfg.timeout_s)
            self.transport.setup(max_num_rows=n * m, max_num_reqs=n, vocab_shard=self.vocab_shard,
                                 logits_dtype=self.dtype, record_width=self.layout.width, device=dev)
            self.records = self.transport.output_buffer()
            self._tiers = {b: self.transport.capacity_tiers(b * m) for b in cfg.buckets}
        else:
            self.records = torch.zeros(n, self.layout.width, dtype=torch.int32, device=dev)
        self.backend = make_backend(cfg.graph_backend, dev)
        if hasattr(self.backend, "register_static_buffers"):
            statics = {"meta": self.inputs.meta, "logits": self.inputs.logits,
                       "drafts": self.inputs.draft_token_ids, "bitmask": self.inputs.grammar_bitmask,
                       "local_records": self.local_records, "records": self.records,
                       "identity_rows": self.identity_rows, "workspace": self.workspace.partials}
            statics.update({f"plan.{k}": v for k, v in self.plan_buffers.as_dict().items()})
            statics.update({f"slots.{k}": v for k, v in vars(self.tables).items()
                            if isinstance(v, torch.Tensor)})
            if self.transport is not None:
                statics["receive"] = self.transport.receive_buffer()
            if self.inputs.staging.device == dev:  # on CUDA it is pinned host memory
                statics["staging"] = self.inputs.staging
            self.backend.register_static_buffers(statics)

    def _setup_faults(self) -> None:
        cfg = self.config
        self._fault: str | None = None
        # XOR of per-slot hashes of (slot, params) over active slots: updated in O(1) per call,
        # and equal on two ranks exactly when they hold the same requests (bar collisions).
        self._slot_hashes = np.zeros(cfg.max_num_slots, dtype=np.int64)
        self._slots_digest = 0
        multi = self.tp_size > 1
        self.reporter = FaultReporter(default_store(self.group) if multi else None, self.group,
                                      self.tp_rank, self.tp_size)
        # Only CUDA steps run asynchronously; elsewhere every wait is bounded inside the step.
        self.watchdog = Watchdog(self.group, 2 * cfg.timeout_s) \
            if multi and self.device.type == "cuda" else None
        self.agreement = AgreementCheck(self.group, self.tp_rank, self.tp_size, self.device,
                                        cfg.timeout_s) if multi and cfg.check_agreement else None

    def _barrier(self) -> None:
        if self.transport is not None:
            self.transport.barrier()

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, slot: int, params: SamplingParams) -> None:
        """Set a slot's sampling parameters (outside any step; identical calls on every rank)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.num_logprobs > self.config.num_logprobs:
            raise ValueError(f"num_logprobs {params.num_logprobs} exceeds the config's "
                             f"num_logprobs ({self.config.num_logprobs})")
        self.tables.set(slot, params)
        self.checker.active[slot] = True
        self._set_slot_hash(slot, digest(int(slot), params))

    def remove_request(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)) \
                or not (0 <= slot < self.config.max_num_slots) or not self.checker.active[slot]:
            raise ValueError(f"slot {slot!r} holds no request")
        self.checker.active[slot] = False
        self._set_slot_hash(slot, 0)

    def _set_slot_hash(self, slot: int, h: int) -> None:
        self._slots_digest ^= int(self._slot_hashes[slot]) ^ h
        self._slot_hashes[slot] = h

    # -- the step functions (what a graph captures) ----------------------------------------------
    def _shard_fn(self, bucket: int, capacity: int):
        cap_reqs = max(1, min(bucket, capacity))
        inp, pb, m = self.inputs, self.plan_buffers, self.config.max_num_logits_per_req
        drafts = inp.draft_token_ids if m > 1 else None

        def step():
            inp.fetch()
            plan(pb, idx_mapping=inp.idx_mapping, cu_num_logits=inp.cu_num_logits, seq_lens=inp.seq_lens,
                 num_reqs=inp.num_reqs, tp_rank=self.tp_rank, gather_stride=cap_reqs,
                 max_num_logits_per_req=m, draft_token_ids=drafts)
            full = self.transport.exchange(pb, inp.logits, None, capacity)
            self.sample(full, vocab_size=self.config.vocab_size, num_reqs=pb.local_num_reqs,
                   req_slots=pb.local_idx_mapping, cu_num_logits=pb.local_cu_num_logits,
                   seq_lens=pb.local_seq_lens, tables=self.tables, layout=self.layout,
                   records=self.local_records, max_num_reqs=cap_reqs,
                   draft_tokens=pb.local_draft_tokens if drafts is not None else None,
                   bitmask=inp.grammar_bitmask, bitmask_rows=pb.local_row_src,
                   bitmask_enabled=inp.bitmask_on)
            self.transport.gather(pb, self.local_records, self.records, cap_reqs, bucket)

        return step

    def _replicate_fn(self, bucket: int):
        inp, m = self.inputs, self.config.max_num_logits_per_req

        def step():
            inp.fetch()
            if self.transport is None:
                full = inp.logits
            else:
                full = self.transport.all_gather_vocab(inp.logits, None, bucket * m)
            self.sample(full, vocab_size=self.config.vocab_size, num_reqs=inp.num_reqs,
                   req_slots=inp.idx_mapping, cu_num_logits=inp.cu_num_logits, seq_lens=inp.seq_lens,
                   tables=self.tables, layout=self.layout, records=self.records, max_num_reqs=bucket,
                   draft_tokens=inp.draft_token_ids if m > 1 else None,
                   bitmask=inp.grammar_bitmask, bitmask_rows=self.identity_rows,
                   bitmask_enabled=inp.bitmask_on)

        return step

    def _step_fn(self, key: StepKey):
        if key.strategy == SHARD:
            return self._shard_fn(key.bucket, key.capacity)
        return self._replicate_fn(key.bucket)

    def _keys_for(self, bucket: int, strategy: str) -> list[StepKey]:
        if strategy == REPLICATE:
            return [StepKey(bucket, REPLICATE, 0)]
        return [StepKey(bucket, SHARD, c) for c in self._tiers[bucket]]

    # -- capture --------------------------------------------------------------------------------
    def capture(self) -> None:
        """Capture every bucket (every capacity tier of it) into one pool, largest first."""
        if self.captured:
            raise RuntimeError("capture() already ran")
        auto = self.config.strategy == "auto" and self.tp_size > 1
        keys = []
        for b in self.config.buckets:
            for strategy in ((SHARD, REPLICATE) if auto else (self._strategy[b],)):
                keys += self._keys_for(b, strategy)
        by_tuple = {k.as_key(): k for k in keys}
        self.graphs.capture(lambda t: self._capture_fn(by_tuple[t]), keys=list(by_tuple))
        if auto:
            self._strategy = choose_strategies(self)
        self.captured = True

    def _capture_fn(self, key: StepKey):
        """The step of `key`, with a valid batch of exactly its bucket staged for warm-up and capture."""
        self._write_placeholder_batch(key.bucket)
        return self._step_fn(key)

    def _write_placeholder_batch(self, n: int) -> None:
        """A valid batch in the static buffers for warm-up and capture (balanced slots, one row each)."""
        idx = np.arange(n, dtype=np.int32)
        cu = np.arange(n + 1, dtype=np.int32)
        self.inputs.write_meta(idx, cu, np.zeros(n, np.int32), bitmask_on=False)

    # -- the step ---------------------------------------------------------------------------------
    def step(self, idx_mapping, cu_num_logits, seq_lens, logits: torch.Tensor,
             draft_token_ids=None, grammar_bitmask=None) -> SamplerOutput:
        """Sample one decode step. Replicated host arrays + this rank's logits shard in batch order.

        Returns views (batch order, first n rows) of static buffers: read them before the next step.
        Every check runs before any device work or collective. Checks of the replicated inputs
        raise identically on every rank. The logits, drafts and bitmask tensors are each rank's
        own: with `check_agreement` a refused one raises on every rank; without it, it raises
        on that rank only, which reports it to its peers, and they fail their step within
        `timeout_s` naming it (DESIGN: pass every rank tensors of the same shape and dtype).
        A peer that dies or stops stepping makes this raise `StepFault` within `timeout_s`
        (2 x `timeout_s` for a CUDA step), after which the engine refuses every step.
        """
        self._check_healthy()
        try:
            idx, cu, lens = self.checker.check(idx_mapping, cu_num_logits, seq_lens)
            n, num_logits = idx.shape[0], int(cu[-1])
            # Replicated checks first: a rank's own tensor error must not hide them.
            bucket = self.graphs.bucket_for(n) if self.captured else None
            if self.captured and bucket is None:
                self.graphs.check_fits(n)
            local_error = self._tensor_error(logits, draft_token_ids, grammar_bitmask, num_logits)
            if self.agreement is not None:
                batch = digest(idx, cu, lens, draft_token_ids is not None, grammar_bitmask is not None)
                self._agree(batch, local_error)
            elif local_error is not None:
                raise local_error
        except (InvalidBatchError, TypeError) as e:
            if self.tp_size > 1:  # peers that went on into the step can then name the cause
                self.reporter.report(f"step {self.steps} refused: {type(e).__name__}: {e}")
            raise
        key = self._choose_key(bucket, idx, cu, n)

        self.inputs.write_meta(idx, cu, lens, bitmask_on=grammar_bitmask is not None)
        with torch.no_grad():  # a grad-tracking shard must not give the static buffers a history
            self.inputs.write_logits(logits, num_logits)
            if self.config.max_num_logits_per_req > 1:
                self.inputs.write_drafts(draft_token_ids, num_logits)
            self.inputs.write_bitmask(grammar_bitmask, num_logits)
        try:
            if bucket is not None:
                self.graphs.replay(key.as_key())
            elif self.captured:
                self.graphs.run_eager(self._step_fn(key), n)
            else:
                self.eager_steps += 1
                self._step_fn(key)()
        except Exception as e:
            self._break(f"{type(e).__name__}: {e}", e)
        finally:
            self.inputs.mark_issued()  # even a failed step may have queued its fetch
        self.steps += 1
        if self.reporter.pending:
            self.reporter.clear()  # an earlier refusal was every rank's: the group went on
        done = self.inputs.issued_event()
        if done is not None and self.watchdog is not None:
            self.watchdog.watch(self.steps - 1, done)
        elif done is None:
            self._check_transport()  # the step ran synchronously: its barriers are done
        return self._outputs(n)

    def _agree(self, batch: int, local_error: Exception | None) -> None:
        try:
            self.agreement.check(self.steps, batch, self._slots_digest, local_error)
        except (InvalidBatchError, TypeError):
            raise
        except Exception as e:  # the collective itself failed: a peer is gone
            self._break(f"the agreement check failed: {type(e).__name__}: {e}", e)

    # -- faults -----------------------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        """Raise `StepFault` if the last step failed (a peer timed out or died). On CUDA a step
        runs after `step()` returns, so a loop that must never act on a failed step's tokens
        calls this after reading them: it waits (bounded) for the step and reads a pinned word."""
        self._check_healthy()

    def _check_healthy(self) -> None:
        """Refuse to step after a fault; on CUDA, wait (bounded) for the previous step first."""
        if self._fault is not None:
            raise StepFault(f"the engine is broken by an earlier fault: {self._fault}")
        if self.watchdog is not None and self.inputs.issued_event() is not None:
            fault = self.watchdog.wait()
            if fault is not None:
                self._break(fault)
            self._check_transport()

    def _check_transport(self) -> None:
        fault = self.transport.fault() if self.transport is not None else None
        if fault is not None:
            self._break(fault)

    def _break(self, what: str, cause: BaseException | None = None):
        """Record the fault, tell the peers and raise it; every later step raises it too."""
        step = max(self.steps - 1, 0) if cause is None else self.steps
        self.reporter.report(f"step {step} failed: {what}")
        self._fault = describe(f"step {step} failed on rank {self.tp_rank}: {what}",
                               self.reporter.peer_reports())
        raise StepFault(self._fault) from cause

    def fail(self, reason: str) -> None:
        """Give up on this rank (its own error, say): the peers' next steps fail within the
        timeout naming `reason`, and this engine refuses every later step."""
        self.reporter.report(f"rank {self.tp_rank} gave up: {reason}")
        self._fault = f"this rank gave up: {reason}"

    def close(self) -> None:
        """Stop the watchdog thread (the engine's buffers go with the object)."""
        if self.watchdog is not None:
            self.watchdog.close()

    def _outputs(self, n: int) -> SamplerOutput:
        """Views of the first n records, built once per n (views cost host time every step)."""
        out = self._views.get(n)
        if out is None:
            out = self._views[n] = unpack(self.records[:n], self.layout)
        return out

    def _choose_key(self, bucket: int | None, idx: np.ndarray, cu: np.ndarray, n: int) -> StepKey:
        size = bucket if bucket is not None else max(n, 1)
        strategy = self._strategy.get(bucket, self._strategy[self.config.max_bucket]) \
            if bucket is not None else self._strategy[self.config.max_bucket]
        if strategy == REPLICATE:
            return StepKey(size, REPLICATE, 0)
        tiers = self._tiers.get(bucket)
        if tiers is not None and len(tiers) == 1:
            return StepKey(size, SHARD, tiers[0])  # one tier (p2p reads the counts on the device)
        _, rows = owner_counts(idx, cu, self.tp_size)
        max_rows = int(rows.max()) if n else 0
        if tiers is None:  # eager: the exact size is the capacity
            return StepKey(size, SHARD, max(1, max_rows))
        return StepKey(size, SHARD, pick_tier(tiers, max_rows))

    def _tensor_error(self, logits, drafts, bitmask, num_logits: int) -> Exception | None:
        """This rank's tensors checked: the error to raise, or None."""
        try:
            self._check_tensors(logits, drafts, bitmask, num_logits)
        except (InvalidBatchError, TypeError) as e:
            return e
        return None

    def _check_tensors(self, logits, drafts, bitmask, num_logits: int) -> None:
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2 or logits.shape != (num_logits, self.vocab_shard):
            raise InvalidBatchError(f"logits must be [{num_logits}, {self.vocab_shard}] (rows x this "
                                    f"rank's vocab shard), got {tuple(logits.shape)}")
        if logits.dtype != self.dtype:
            raise TypeError(f"logits must be {self.dtype} (config logits_dtype), got {logits.dtype}")
        if logits.device != self.device:
            raise InvalidBatchError(f"logits is on {logits.device}, the engine runs on {self.device}")
        if logits.stride(-1) != 1:
            raise InvalidBatchError("logits rows must be contiguous (last-dim stride 1)")
        _check_not_misplaced("logits", logits, self.inputs.logits)
        if drafts is not None:
            if self.config.max_num_logits_per_req == 1:
                raise InvalidBatchError("draft_token_ids given but max_num_logits_per_req is 1")
            _check_int32_input("draft_token_ids", drafts, (num_logits,), self.device)
            _check_not_misplaced("draft_token_ids", drafts, self.inputs.draft_token_ids)
        if bitmask is not None:
            # DESIGN sizes it by the padded vocabulary; a width covering the real one is accepted.
            words = self.inputs.grammar_bitmask.shape[1]
            real_words = -(-self.config.vocab_size // 32)
            width = bitmask.shape[-1] if isinstance(bitmask, torch.Tensor) and bitmask.dim() == 2 else words
            _check_int32_input("grammar_bitmask", bitmask,
                               (num_logits, width if width in (words, real_words) else words), self.device)
            _check_not_misplaced("grammar_bitmask", bitmask, self.inputs.grammar_bitmask)

    # -- reporting --------------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.graphs.stats()
        return {"replays": dict(s.replays), "eager_fallbacks": s.eager_fallbacks,
                "eager_steps": self.eager_steps, "capture_s": s.capture_total_s,
                "graph_memory_bytes": s.graph_memory_bytes,
                "strategy": dict(self._strategy),
                "transport": self.transport.name if self.transport is not None else "none",
                "graph_backend": getattr(self.backend, "name", type(self.backend).__name__)}


def _check_not_misplaced(name: str, value: torch.Tensor, static: torch.Tensor) -> None:
    """A tensor inside a static input buffer must be that buffer's leading rows (the zero-copy
    path); any other view would be copied onto itself."""
    if value.numel() == 0 or value.untyped_storage().data_ptr() != static.untyped_storage().data_ptr():
        return
    if value.data_ptr() != static.data_ptr() or value.stride() != static[: value.shape[0]].stride():
        raise InvalidBatchError(f"{name} is a view into the engine's static {name} buffer other "
                                f"than its leading rows; pass engine.inputs' buffer[:num_logits]")


def _check_int32_input(name: str, value, shape: tuple, device: torch.device) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {value.dtype}")
    if tuple(value.shape) != shape:
        raise InvalidBatchError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if value.device != device:
        raise InvalidBatchError(f"{name} is on {value.device}, the engine runs on {device}")
