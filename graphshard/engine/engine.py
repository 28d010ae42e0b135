"""The engine: what a decode loop holds. Static buffers, per-slot state, capture and `step()`.

A step on rank r (docs/design.md, "The parts of a step"): plan -> exchange logits to their owners -> sample the owned
rows -> gather the per-request records to every rank in batch order. With `capture()` every
bucket runs as one graph replay; batches above the largest bucket run the same code eagerly.
"""

from __future__ import annotations

import functools
import logging
import time
import warnings
from typing import Callable, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist

from graphshard.engine.agreement import AgreementCheck, SlotDigest, digest
from graphshard.engine.capture import (COMPILE_SKEW_S, compile_samplers, fallback_keys, graph_keys,
                                       placeholder_batch, timing_keys)
from graphshard.config import LOGITS_DTYPES, Config
from graphshard.runtime.devices import check_kernels_run_on, resolve_device
from graphshard.runtime.pdl import supports_pdl
from graphshard.engine.divergence import DivergenceCheck
from graphshard.errors import (EngineStateError, InvalidBatchError, InvalidParamsError, InvalidSlotError,
                               InvalidTypeError, StepFault)
from graphshard.engine.faults import FaultGuard
from graphshard.graphs import GraphManager, make_backend
from graphshard.engine.inputs import StepInputs
from graphshard.engine.readout import HostRecords
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.plan.layout import PlanBuffers
from graphshard.sample.records import HostOutput, RecordLayout, SamplerOutput, unpack
from graphshard.engine.rendezvous import Rendezvous
from graphshard.engine.routes import Route, eager_key, keys_for, unmasked
from graphshard.sample.kernels import SamplerWorkspace, bitmask_words, sample
from graphshard.engine.steps import StepParts
from graphshard.engine.strategy import REPLICATE, SHARD, choose_strategies
from graphshard.engine.validate import BatchChecker, BatchLimits

logger = logging.getLogger(__name__)

# A replicated step input: a host array of int32 (preferred), a list or a CPU tensor.
IntArray = Union[np.ndarray, Sequence[int], torch.Tensor]

DTYPES = {name: getattr(torch, name) for name in LOGITS_DTYPES}

SAMPLER_CONTRACT = """A replacement sampler is a callable with the keyword signature of
`graphshard.sample.kernels.sample`: `(logits, *, vocab_size, num_reqs, req_slots, cu_num_logits,
seq_lens, tables, layout, records, max_num_reqs, draft_tokens, bitmask, bitmask_rows,
bitmask_enabled)`; the three bitmask arguments are None in an engine whose config has
`grammar_bitmask = false`. It runs inside the captured step, so it must:
- read the request count from `num_reqs` (int32 [1], device) and treat `max_num_reqs` as a static
  bound: no `.item()`, `.tolist()`, `.cpu()`, `nonzero` or Python branch on tensor values;
- write one packed record per request j < n into `records[j]` (`graphshard.sample.records`
  layout) and allocate nothing that outlives the call;
- draw random tokens from (slot seed, position, token id) only, if the sharded result is to
  equal the unsharded one.
`graphshard.harness.testing.check_graph_safe` (CPU, emulated graphs) checks a sampler against the first
two rules; an Engine built with it on the emulated backend refuses violations at capture."""


class Engine:
    """Batch-sharded sampling for one TP group. Every rank builds one with the same config.

    What a decode loop reads (README "The step" has the whole contract):
    - `vocab`: the padded vocabulary the LM head emits, a multiple of `vocab_pad_multiple * tp`
      (so it depends on the TP size); `vocab_shard = vocab // tp_size` columns per rank, and
      `shard_columns()` is this rank's `(lo, hi)` range of them.
    - `inputs.logits`: the static [max_num_reqs * M, vocab_shard] logits buffer; writing a step's
      shard into its leading rows and passing that view skips a copy.
    - `layout`: the packed record layout of the step's outputs; `tp_rank`, `tp_size`, `device`,
      `dtype` (the logits dtype), `steps` (steps issued so far).
    """

    def __init__(self, config: Config, group: dist.ProcessGroup | None = None,
                 device: torch.device | str | None = None,
                 sampler: Callable[..., None] | None = None) -> None:
        """Collective: every rank of `group` (default: the default group; tp = 1 without one)
        builds its engine with the same config. `device` defaults to the current CUDA device,
        else the CPU. `sampler` replaces the built-in Triton sampler; see `SAMPLER_CONTRACT`."""
        self.config = config
        self._user_sampler = sampler
        distributed = dist.is_available() and dist.is_initialized()
        self.group = group if group is not None else (dist.group.WORLD if distributed else None)
        self.tp_size = dist.get_world_size(self.group) if self.group is not None else 1
        self.tp_rank = dist.get_rank(self.group) if self.group is not None else 0
        self.device = resolve_device(device)
        check_kernels_run_on(self.device)
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
        self.strategy_timings: dict[int, tuple[float, float]] = {}  # auto: bucket -> (shard, replicate) s
        self.captured = False
        self.eager_steps = 0
        self.steps = 0  # steps issued, the same count on every rank
        self._capture_s = 0.0
        self._compile_s = 0.0  # capture()'s compile of the sampler variants, ahead of the graphs
        self._compiled_variants = 0
        self._one_row = config.max_num_logits_per_req == 1  # then num_logits == n
        self._routes: list[Route] = []  # index n <= largest bucket, once captured
        self._views: dict[int, SamplerOutput] = {}
        self._eager_fns: dict[tuple, Callable[[], None]] = {}  # `_run_eager`'s, by step key
        self._sizes = [0, 0]  # n of the last two issued steps, by parity (`read`)
        self._first_readable = 0  # capture() reruns placeholder batches over the last results
        self._closed = False
        # Steps without graphs are slow on CUDA: rank 0 says so once.
        self._warn_uncaptured = self.device.type == "cuda" and self.tp_rank == 0
        self._setup_faults()
        self.parts = self._step_parts()
        if hasattr(self.backend, "register_static_buffers"):
            self.backend.register_static_buffers(self.parts.static_buffers())

    # -- set-up --------------------------------------------------------------------------------
    def _allocate(self) -> None:
        cfg, dev = self.config, self.device
        n, m = cfg.max_num_reqs, cfg.max_num_logits_per_req
        self.tables = SlotTables(cfg.max_num_slots, dev)
        self.inputs = StepInputs(max_num_reqs=n, max_num_logits_per_req=m,
                                 vocab_shard=self.vocab_shard,
                                 bitmask_words=bitmask_words(self.vocab),
                                 logits_dtype=self.dtype, device=dev,
                                 real_bitmask_words=bitmask_words(cfg.vocab_size),
                                 grammar_bitmask=cfg.grammar_bitmask)
        self.plan_buffers = PlanBuffers.allocate(n, m, self.tp_size, dev)
        # One workspace serves every graph: steps run one after another on one stream.
        self.workspace = SamplerWorkspace.allocate(n, m, cfg.vocab_size, dev)
        # Whether the step's own kernels are launched as programmatic dependents (the config
        # asks, and the device can).
        self.programmatic_launch = cfg.programmatic_launch and supports_pdl(dev)
        self.sample = self._user_sampler or functools.partial(
            sample, workspace=self.workspace, pdl=self.programmatic_launch)
        # Whether each bucket also has a graph without bitmask support, for steps given none.
        self.bitmask_free_graphs = (cfg.bitmask_free_graphs and cfg.grammar_bitmask
                                    and self.tp_size == 1 and self._user_sampler is None)
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
        # tp = 1: the step's last kernel copies its records to the host (`read`).
        self.host_records = HostRecords(self.records, self.inputs.staged, self.inputs.num_reqs,
                                        tokens_per_record=m, pdl=self.programmatic_launch) \
            if self.transport is None else None
        # Rows the checked record gather appends the divergence digest in (padded transports).
        self._digest_rows = self.transport.digest_rows \
            if self.transport is not None and cfg.divergence_check else 0
        self.local_records = torch.zeros(n + self._digest_rows, self.layout.width,
                                         dtype=torch.int32, device=dev)
        self.backend = make_backend(cfg.graph_backend, dev)

    def _setup_faults(self) -> None:
        cfg, multi = self.config, self.tp_size > 1
        self.faults = FaultGuard(group=self.group, rank=self.tp_rank, world_size=self.tp_size,
                                 device=self.device, timeout_s=cfg.timeout_s, transport=self.transport,
                                 done=self.inputs.staged.done_view)
        self.slot_digest = SlotDigest(cfg.max_num_slots)
        self.agreement = AgreementCheck(self.group, self.tp_rank, self.tp_size, self.device,
                                        cfg.timeout_s) if multi and cfg.check_agreement else None
        self.divergence = DivergenceCheck(self.tp_rank, self.tp_size, self.device,
                                          self.inputs.staged) if multi and cfg.divergence_check else None
        self._digest_slots = self.agreement is not None or self.divergence is not None
        reporter = self.faults.reporter
        self.rendezvous = Rendezvous(reporter.store, reporter.prefix, self.tp_rank, self.tp_size,
                                     cfg.timeout_s)

    def _step_parts(self) -> StepParts:
        cfg = self.config
        return StepParts(inputs=self.inputs, plan=self.plan_buffers, tables=self.tables,
                         layout=self.layout, sampler=self.sample, workspace=self.workspace.buffer,
                         records=self.records, local_records=self.local_records,
                         identity_rows=self.identity_rows, transport=self.transport,
                         host_records=self.host_records,
                         divergence=self.divergence, vocab_size=cfg.vocab_size,
                         max_num_logits_per_req=cfg.max_num_logits_per_req, tp_rank=self.tp_rank,
                         digest_rows=self._digest_rows,
                         programmatic_launch=self.programmatic_launch,
                         replay_sampler=self._user_sampler is None)

    def _barrier(self) -> None:
        if self.transport is not None:
            self.transport.barrier()

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, slot: int, params: SamplingParams, *, replace: bool = False) -> None:
        """Give request slot `slot` (0 <= slot < max_num_slots) its sampling parameters. Outside
        any step, with identical calls on every rank. A slot that already holds a request raises
        `InvalidSlotError` unless `replace=True` (then its parameters change from the next step).
        Errors (`InvalidSlotError`, `InvalidTypeError`, `InvalidParamsError`) change nothing."""
        self._check_open("add_request")
        if not isinstance(params, SamplingParams):
            raise InvalidTypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.num_logprobs > self.config.num_logprobs:
            raise InvalidParamsError(f"num_logprobs {params.num_logprobs} exceeds the config's "
                                     f"num_logprobs ({self.config.num_logprobs})")
        self._check_slot(slot)
        if self.checker.active[slot] and not replace:
            raise InvalidSlotError(f"slot {slot} already holds a request; remove_request({slot}) "
                                   f"first, or pass replace=True to change its parameters")
        self.tables.set(slot, params)
        self.checker.activate(slot)
        if self._digest_slots:
            self.slot_digest.set(slot, params)

    def remove_request(self, slot: int) -> None:
        """Free a slot that holds a request (identical calls on every rank); anything else (a
        free slot, one out of range, a non-integer) raises `InvalidSlotError`."""
        self._check_open("remove_request")
        if isinstance(slot, (bool, np.bool_)) or not isinstance(slot, (int, np.integer)) \
                or not (0 <= slot < self.config.max_num_slots) or not self.checker.active[slot]:
            raise InvalidSlotError(f"slot {slot!r} holds no request")
        self.checker.deactivate(slot)
        if self._digest_slots:
            self.slot_digest.remove(slot)

    def _check_slot(self, slot) -> None:
        if isinstance(slot, (bool, np.bool_)) or not isinstance(slot, (int, np.integer)):
            raise InvalidTypeError(f"slot must be an integer, got {type(slot).__name__} ({slot!r})")
        if not 0 <= slot < self.config.max_num_slots:
            raise InvalidSlotError(f"slot {slot!r} out of range [0, {self.config.max_num_slots})")

    def shard_columns(self, rank: int | None = None) -> tuple[int, int]:
        """The `(lo, hi)` columns of the padded vocabulary that `rank` (default: this rank) holds:
        its logits shard is `full_logits[:, lo:hi]`, i.e. rows lo..hi-1 of a vocab-parallel LM
        head's weight padded to `vocab` rows. Columns >= `config.vocab_size` are padding, never
        read."""
        rank = self.tp_rank if rank is None else rank
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.tp_size:
            raise ValueError(f"rank must be an integer in [0, {self.tp_size}), got {rank!r}")
        lo = int(rank) * self.vocab_shard
        return lo, lo + self.vocab_shard

    # -- capture --------------------------------------------------------------------------------
    def capture(self) -> None:
        """Capture every bucket (every capacity tier of it) into one pool, largest first; with
        strategy "auto", time both strategies per bucket and keep the faster (`stats()`). At
        tp = 1 with `bitmask_free_graphs`, every bucket a second time without bitmask support.

        Collective: every rank calls it, once. The ranks first meet through the group's store,
        so a capture() that some ranks never call raises `RankDivergenceError` on every rank
        that called it within `timeout_s` (at once on one that calls it later), before any
        collective has run; a later capture() on every rank still works."""
        self._check_open("capture")
        if self.captured:
            raise EngineStateError("capture() already ran")
        self.faults.check_standing()
        start = time.perf_counter()  # capture_s counts everything from here, the meeting too
        self.rendezvous.meet("capture")
        self.faults.drain(self.steps - 1)  # placeholder batches are about to be staged
        cfg = self.config
        auto = cfg.strategy == "auto" and self.tp_size > 1
        keys = graph_keys(cfg, self._strategy, self._tiers, auto, self.bitmask_free_graphs)
        self._compile_samplers(keys + fallback_keys(cfg, self._strategy, self.tp_size, auto))
        self.graphs.capture(self._capture_fn, keys=keys)
        if auto:
            self._strategy, self.strategy_timings = choose_strategies(
                self.graphs, timing_keys(cfg, self.tp_size, self.transport),
                self._write_placeholder_batch, self.device, self.group)
        self._routes = [self._route(n) for n in range(self.config.max_bucket + 1)]
        self._first_readable = self.steps
        self.captured = True
        self._capture_s = time.perf_counter() - start

    def _compile_samplers(self, keys: list[tuple]) -> None:
        """Compile the sampler variants the steps of `keys` will launch (`compile_samplers`).
        The engine's other kernels compile in seconds, at first launch."""
        if self._user_sampler is not None or self.device.type != "cuda":
            return
        start = time.perf_counter()
        self._compiled_variants = compile_samplers(self.parts.sampler_launches(keys), self.device,
                                                   self.tp_size)
        self._compile_s = time.perf_counter() - start
        # The first warm-up's collectives would wait for a rank still compiling, on p2p in a
        # device-side wait bounded by timeout_s; the ranks meet on the host first, allowing for
        # compile times that differ between ranks.
        self.rendezvous.meet("capture", timeout_s=self.config.timeout_s + COMPILE_SKEW_S)

    def _capture_fn(self, key: tuple):
        """The step of `key`, with a valid batch of exactly its bucket staged for warm-up and capture."""
        self._write_placeholder_batch(key[0])
        return self.parts.step_fn(key)

    def _write_placeholder_batch(self, n: int) -> None:
        """`placeholder_batch(n)`, staged as the last issued step, so the device's done word
        stays where it is."""
        self.inputs.stage_placeholder(self.steps - 1, *placeholder_batch(n))

    def _route(self, n: int) -> Route:
        bucket = self.graphs.bucket_for(n)
        keys = keys_for(bucket, self._strategy[bucket], self._tiers.get(bucket))
        free = self.graphs.replayer(unmasked(keys[0])) if self.bitmask_free_graphs else None
        return Route(keys, [self.graphs.replayer(key) for key in keys], self._unpack(n), free)

    # -- the step ---------------------------------------------------------------------------------
    def step(self, idx_mapping: IntArray, cu_num_logits: IntArray, seq_lens: IntArray,
             logits: torch.Tensor | None, draft_token_ids: torch.Tensor | None = None,
             grammar_bitmask: torch.Tensor | None = None) -> SamplerOutput:
        """Sample one decode step of n requests (n <= max_num_reqs); every rank calls it.

        Replicated arguments (host arrays, int32 preferred: NumPy, lists or CPU tensors; the
        same values on every rank, in batch order):
        - `idx_mapping` [n]: request j's slot (given its parameters by `add_request`).
        - `cu_num_logits` [n + 1]: cumulative logits rows, from 0. Request j owns rows
          cu[j] .. cu[j+1]-1 of `logits`: 1 row, or 1 + d rows when it verifies d draft tokens
          (at most `max_num_logits_per_req`). num_logits = cu[n].
        - `seq_lens` [n]: request j's position, >= 0; row k of request j draws its random number
          at position seq_lens[j] + k (draws are keyed by slot seed, position and token id).
        This rank's own arguments (on the engine's device):
        - `logits` [num_logits, vocab_shard] in the config's `logits_dtype`: this rank's columns
          `shard_columns()` of the padded vocabulary, rows in batch order. Writing them into
          `inputs.logits[:num_logits]` and passing that view skips a copy; passing None says
          they are there and skips the view and its checks too (~1.7 µs of slicing and ~0.9
          of checks a step on a 2-core CPU).
        - `draft_token_ids` [num_logits] int32 or None: row k's draft token, compared with what
          row k samples (longest matching prefix accepted); a request's last row is ignored.
        - `grammar_bitmask` [num_logits, ceil(vocab / 32)] int32 or None (ceil(vocab_size / 32)
          words accepted too): bit t % 32 of word t // 32 allows token t on that row. Refused
          by an engine whose config has `grammar_bitmask = false`.

        Example, 3 requests, request 1 verifying two drafts (5, 9), max_num_logits_per_req 3:
        idx_mapping [4, 0, 7], cu_num_logits [0, 1, 4, 5], seq_lens [12, 30, 7], logits [5, V/tp]
        (rows: req 0 | req 1 x3 | req 2), draft_token_ids [-1, 5, 9, -1, -1]. If request 1's rows
        sample 5, 2, 8: it gets tokens [5, 2] (5 accepted, 2 the correction), num_sampled 2,
        num_rejected 1; requests 0 and 2 get one token each.

        Returns views of static buffers (batch order, the first n rows): `sampled_token_ids`
        [n, M] (-1 past num_sampled), `num_sampled`, `num_rejected`, `num_nans` (rows with a NaN in
        the real vocabulary; NaN samples as -inf, a row with no finite logit samples token 0),
        and with logprobs the top-K ids and logprobs and the sampled token's logprob and rank.
        Every rank gets the same values; at tp = 1 `sampled_token_ids` is a contiguous copy of
        the records' token ids (its `.cpu()` is one copy). The next step overwrites them: read
        them first (`out.to_host()`: one copy, NumPy arrays) or enqueue their copy before issuing
        it.

        Every check runs before any device work or collective. Checks of the replicated inputs
        raise identically on every rank and change nothing (`InvalidBatchError` and its
        subclasses). The logits, drafts and bitmask
        tensors are each rank's own: with `check_agreement` a refused one raises on every rank
        (and so does any divergence); without it, the refusing rank's peers are already inside
        the step, so that rank gives up (its engine refuses every later step) and the peers fail
        within `timeout_s` naming its error.
        Ranks that diverge (other replicated inputs, slot tables or step counts) are caught inside
        the step by the default `divergence_check`: `raise_if_failed` (on CPU this call) raises
        `RankDivergenceError` on every rank and the step's results are discarded.
        On CUDA two steps may be in flight: this returns once the step is queued, and only waits
        for the step before the previous one. A peer that dies or stops stepping makes this (or
        `raise_if_failed`) raise `StepFault` within `timeout_s` (2 x `timeout_s` + 1 s for a
        CUDA step that hangs in NCCL), after which the engine refuses every step. After
        `close()` it raises `EngineStateError`.
        """
        if self._closed:
            self._check_open("step")
        self.faults.check_standing()
        idx, cu, lens, refusal = self._check_step(idx_mapping, cu_num_logits, seq_lens, logits,
                                                  draft_token_ids, grammar_bitmask)
        n = idx.shape[0]
        step = self._admit(refusal, draft_token_ids, grammar_bitmask)
        self._stage(step, idx, cu, lens, logits, draft_token_ids, grammar_bitmask)
        self._sizes[step & 1] = n
        route = self._routes[n] if n < len(self._routes) else None
        self._run(step, route, idx, cu, grammar_bitmask is None)
        self._settle(step, refusal)
        return route.out if route is not None else self._outputs(n)

    def _admit(self, refusal, drafts, bitmask) -> int:
        """Admit the next step to the fault guard and, with the divergence check, seal what the
        ranks must agree on; returns the step number."""
        step = self.steps
        self.faults.admit(step)
        divergence = self.divergence
        if divergence is not None:
            divergence.begin(step, self.slot_digest.value, self.faults,
                             divergence.flags(bitmask is not None, drafts is not None,
                                              refusal is not None))
        return step

    def _stage(self, step, idx, cu, lens, logits, drafts, bitmask) -> None:
        """Stage the replicated inputs, and copy the tensors unless the logits are already in
        place (the zero-copy path of a one-row layout without a bitmask)."""
        n = idx.shape[0]
        num_logits = n if self._one_row else int(cu[n])
        inputs = self.inputs
        inputs.stage(step, idx, cu, lens, bitmask is not None)
        if not (self._one_row and bitmask is None and inputs.is_zero_copy(logits, num_logits)):
            inputs.write_tensors(logits, drafts, bitmask, num_logits)

    def _run(self, step, route, idx, cu, no_bitmask: bool) -> None:
        """Replay the step's graph (or run it eagerly past the buckets): without bitmask support
        where the step passes no bitmask and the route has that graph. A failure fails the step
        in the fault guard."""
        try:
            if route is not None:
                ((no_bitmask and route.unmasked) or route.replay
                 or route.replay_for(idx, cu, self.tp_size, self._one_row))()
            else:
                self._run_eager(idx, cu, idx.shape[0])
        except Exception as e:
            self.faults.abandon(step)
            self.faults.fail(step, f"{type(e).__name__}: {e}", e)

    def _settle(self, step, refusal) -> None:
        """Count the step; where steps run synchronously (CPU), settle its faults and divergence
        verdict now."""
        faults, divergence = self.faults, self.divergence
        self.steps = step + 1
        if faults.synchronous:
            faults.ran(step)
        if refusal is not None:
            divergence.settle_refusal(step, refusal, faults.check)
        if divergence is not None and faults.synchronous:
            divergence.check(step)

    def _check_step(self, idx_mapping, cu_num_logits, seq_lens, logits, drafts, bitmask):
        """Every check of a step's inputs: (idx, cu, lens), or raise (see `step`). The common
        case passes the cheap tests; anything else takes the exact checks, whose errors these are."""
        if self.agreement is None and self.checker.accepts(idx_mapping, cu_num_logits, seq_lens):
            n = idx_mapping.shape[0]
            if n < len(self._routes) or not self.captured or self.config.fallback != "error":
                num_logits = n if self._one_row else int(cu_num_logits[n])
                try:
                    fit = self.inputs.tensors_fit(logits, drafts, bitmask, num_logits)
                except RuntimeError:  # torch's own refusal (a nested tensor has no shape): the
                    fit = False       # exact checks name it
                if fit:
                    return idx_mapping, cu_num_logits, seq_lens, None
        return self._check_step_exactly(idx_mapping, cu_num_logits, seq_lens, logits, drafts, bitmask)

    def _check_step_exactly(self, idx_mapping, cu_num_logits, seq_lens, logits, drafts, bitmask):
        replicated_error = local_error = checked = None
        try:
            idx, cu, lens = self.checker.check_exactly(idx_mapping, cu_num_logits, seq_lens)
            # Replicated checks first: a rank's own tensor error must not hide them.
            if self.captured:
                self.graphs.check_fits(idx.shape[0])
            self.inputs.check_supported(drafts, bitmask)
            checked = (idx, cu, lens)
            local_error = self.inputs.tensor_error(logits, drafts, bitmask, int(cu[-1]))
        except (InvalidBatchError, TypeError) as e:
            replicated_error = e
        if self.agreement is not None:
            # Even a refused batch joins the check, so a rank that diverged into a refusal (a
            # missed add_request, say) makes every rank raise rather than leave its peers waiting.
            batch = digest(*checked, drafts is not None, bitmask is not None) if checked \
                else digest("refused", type(replicated_error).__name__, str(replicated_error))
            self._agree(batch, replicated_error, local_error)
        elif replicated_error is not None:
            refused = self._refused_slot_state(replicated_error, idx_mapping, cu_num_logits, seq_lens,
                                               logits, drafts, bitmask)
            if refused is not None:
                return refused
            if self.tp_size > 1:
                self.faults.refused(self.steps, replicated_error)
            raise replicated_error
        elif local_error is not None:
            if self.tp_size > 1:  # the peers are inside the step: this rank can never catch up
                self.faults.give_up(f"step {self.steps}: its own tensors were refused: "
                                    f"{type(local_error).__name__}: {local_error}")
            raise local_error
        return (*checked, None)

    def _refused_slot_state(self, error, idx_mapping, cu_num_logits, seq_lens, logits, drafts,
                            bitmask):
        """With the divergence check, a batch refused only for naming a slot that holds no
        request here is the one refusal that depends on this rank's own state (a missed
        add_request): its peers may have accepted it and be inside the step already. Then the
        step runs anyway, its digest marked refused, and every rank learns what happened
        (`DivergenceCheck.settle_refusal`). Anything else stays refused here, identically on
        every rank."""
        if self.divergence is None:
            return None
        try:  # the same checks less the one that looks at this rank's slots
            idx, cu, lens = self.checker.check_exactly(idx_mapping, cu_num_logits, seq_lens,
                                                       require_active=False)
            if self.captured:
                self.graphs.check_fits(idx.shape[0])
            self.inputs.check_supported(drafts, bitmask)
        except (InvalidBatchError, TypeError):
            return None
        if self.inputs.tensor_error(logits, drafts, bitmask, int(cu[-1])) is not None:
            return None
        return idx, cu, lens, error

    def _agree(self, batch: int, replicated_error: Exception | None,
               local_error: Exception | None) -> None:
        try:
            self.agreement.check(self.steps, batch, self.slot_digest.value, replicated_error,
                                 local_error, wait=self.faults.wait_for)
        except (InvalidBatchError, TypeError, StepFault):
            raise
        except Exception as e:  # the collective itself failed: a peer is gone
            self.faults.fail(self.steps, f"the agreement check failed: {type(e).__name__}: {e}", e)

    def _run_eager(self, idx: np.ndarray, cu: np.ndarray, n: int) -> None:
        """Above the largest bucket (or before capture): the same step, run without a graph."""
        key = eager_key(n, idx, cu, self._strategy[self.config.max_bucket], self.tp_size)
        fn = self._eager_fns.get(key)
        if fn is None:  # built once per key: ~10 µs of closures a step on an H100's host
            fn = self._eager_fns[key] = self.parts.step_fn(key)
        if self.captured:
            self.graphs.run_eager(fn, n)
        else:
            if self._warn_uncaptured:
                self._warn_uncaptured = False
                warnings.warn("graphshard: steps are running without CUDA graphs (capture() was not "
                              "called); call engine.capture() once after building the engine",
                              RuntimeWarning, stacklevel=3)
            self.eager_steps += 1
            fn()

    # -- results on the host ----------------------------------------------------------------------
    def read(self, step: int | None = None) -> HostOutput:
        """Step `step`'s results on the host (default: the last issued step) as NumPy arrays the
        caller owns, batch order (`HostOutput`). Waits for the step and raises what
        `raise_if_failed(step)` raises, so no failed step's tokens are returned.

        At tp = 1 the step's last kernel copied its records into pinned host memory
        (`graphshard.engine.readout`): this waits for the step's done word and copies them out
        with NumPy, with no device call, and either of the last two issued steps can be read.
        At tp > 1 it copies the records from the device: only the last issued step. Steps
        issued before `capture()` cannot be read afterwards (the capture reran placeholder
        batches over them)."""
        last = self.steps - 1
        if step is None and last >= self._first_readable:
            step = last  # the common call: the last issued step, readable
        else:
            step = self._readable(step, last)
        self.faults.drain(step)
        self.raise_if_failed(step)
        n = self._sizes[step & 1]
        if self.host_records is not None:
            return HostOutput(self.host_records.rows(step, n), self.layout)
        return self._unpack(n).to_host()

    def _readable(self, step, last: int) -> int:
        """`step` (None: `last`) as an int if `read` may read it now, else raise ValueError."""
        step = last if step is None else step
        oldest = max(last - 1 if self.host_records is not None else last, self._first_readable)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) \
                or not oldest <= step <= last:
            readable = "no step" if oldest > last else \
                (f"step {last}" if oldest == last else f"steps {oldest}..{last}")
            raise ValueError(f"read(step={step!r}): {readable} can be read now (the last issued "
                             f"step{'' if self.host_records is None else ' and the one before'})")
        return int(step)

    # -- faults -----------------------------------------------------------------------------------
    def raise_if_failed(self, step: int | None = None) -> None:
        """Raise `StepFault` if step `step` (default: the last issued one) failed: a peer timed
        out or died. On CUDA a step runs after `step()` returns, so a loop that must never act on
        a failed step's tokens calls this after reading them: it waits (bounded) for the step and
        reads two pinned words. A loop that reads results one step late passes that step's
        number (`engine.steps - 2` after issuing the next one)."""
        step = self.steps - 1 if step is None else step
        self.faults.check(step)
        if self.divergence is not None:
            self.divergence.check(step)

    def fail(self, reason: str) -> None:
        """Give up on this rank (its own error, say): the peers' next steps fail within the
        timeout naming `reason`, and this engine refuses every later step."""
        self.faults.give_up(reason)

    def close(self) -> None:
        """Stop the watchdog thread (the engine's buffers go with the object). Afterwards
        `step`, `capture`, `add_request` and `remove_request` raise `EngineStateError`; `stats`
        and `raise_if_failed` still answer. Closing twice is harmless."""
        self._closed = True
        self.faults.close()

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise EngineStateError(f"{call}() on a closed engine: close() was called")

    def _outputs(self, n: int) -> SamplerOutput:
        """Views of the first n records of an eager step, built once per n."""
        out = self._views.get(n)
        if out is None:
            out = self._views[n] = self._unpack(n)
        return out

    def _unpack(self, n: int) -> SamplerOutput:
        """Views of the first n records; at tp = 1 `sampled_token_ids` is the step's contiguous
        copy of their token ids (`HostRecords.tokens`), so a loop's `.cpu()` of it is one copy."""
        tokens = self.host_records.tokens[:n] if self.host_records is not None else None
        return unpack(self.records[:n], self.layout, tokens)

    # -- reporting --------------------------------------------------------------------------------
    def stats(self) -> dict:
        """Counters and capture facts. `capture_s` is the whole `capture()` (graphs and, with
        strategy "auto", the timing runs); `strategy` is each bucket's strategy and, for "auto",
        `strategy_timings_us` what each measured (median µs per replay, slowest rank)."""
        s = self.graphs.stats()
        return {"replays": dict(s.replays), "eager_fallbacks": s.eager_fallbacks,
                "eager_steps": self.eager_steps, "capture_s": self._capture_s,
                "sampler_compile_s": self._compile_s,
                "sampler_variants_compiled": self._compiled_variants,
                "graph_capture_s": s.capture_total_s, "graph_memory_bytes": s.graph_memory_bytes,
                "strategy": dict(self._strategy),
                "strategy_timings_us": {b: {SHARD: t[0] * 1e6, REPLICATE: t[1] * 1e6}
                                        for b, t in self.strategy_timings.items()},
                "transport": self.transport.name if self.transport is not None else "none",
                "graph_backend": getattr(self.backend, "name", type(self.backend).__name__),
                "programmatic_launch": self.programmatic_launch,
                "bitmask_free_graphs": self.bitmask_free_graphs}

