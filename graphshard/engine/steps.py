"""The step functions a graph captures, one per key: plan -> exchange -> sample -> gather.

A key is `(bucket, strategy, capacity[, "unmasked"])` (`graphshard.engine.routes`): a shard
step samples the rows this rank owns after the exchange; a replicate step (tp = 1 included)
samples every row.

Every step ends closed: its last transport call (`gather`, or `close` for replicate) ends with
a barrier every rank passes only once its peers have finished reading what the step delivered.
Nothing else touches the transport between steps but two-phase barriers (capture), so each
step's push skips its own start barrier (`fenced=False`; the argument, first steps and failures
included, is in graphshard/transports/p2p.py). The same call ends the step on the device
(`done`), with no kernel of its own on p2p.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch

from graphshard.engine.divergence import DivergenceCheck
from graphshard.engine.inputs import StepInputs
from graphshard.engine.readout import HostRecords
from graphshard.engine.routes import is_unmasked
from graphshard.engine.strategy import SHARD
from graphshard.plan.kernel import fetch_and_plan
from graphshard.plan.layout import PlanBuffers
from graphshard.runtime.launch import Launch, deferred_launches, recorded
from graphshard.sample.params import SlotTables
from graphshard.sample.records import RecordLayout

if TYPE_CHECKING:
    from graphshard.transports.base import Transport


@dataclass(frozen=True)
class StepParts:
    """What a step's kernels read and write: the engine's static buffers, its sampler and its
    transport (None at tp = 1). The step functions close over these, so a captured graph
    replays on exactly these buffers."""

    inputs: StepInputs
    plan: PlanBuffers
    tables: SlotTables
    layout: RecordLayout
    sampler: Callable[..., None]
    workspace: torch.Tensor  # the built-in sampler's scratch, one for every graph
    records: torch.Tensor  # [max_num_reqs, width]: the step's records in batch order
    local_records: torch.Tensor  # [max_num_reqs + digest_rows, width]: a shard step's own
    identity_rows: torch.Tensor  # [max_num_reqs * M]: row i is its own bitmask row
    transport: Transport | None
    host_records: HostRecords | None  # tp = 1: the step's copy of its records to the host
    divergence: DivergenceCheck | None
    vocab_size: int
    max_num_logits_per_req: int
    tp_rank: int
    digest_rows: int  # rows the checked record gather appends the divergence digest in
    programmatic_launch: bool
    # The sampler is the built-in one, whose device work is launches alone: a step function's
    # sampler call replays the launches its first call recorded (`runtime.launch.recorded`).
    replay_sampler: bool = False
    # `sample_fn`'s calls by key, so that the compile-ahead's recording of a key's launches
    # (`sampler_launches`) is what its step replays, from the first step.
    _samples: dict = field(default_factory=dict, compare=False, repr=False)

    def static_buffers(self) -> dict[str, torch.Tensor]:
        """Every buffer a step reads or writes, by name: what a graph backend may let a captured
        step touch (the emulated backend refuses anything else)."""
        inp = self.inputs
        statics = {"meta": inp.meta, "logits": inp.logits, "drafts": inp.draft_token_ids,
                   "local_records": self.local_records, "records": self.records,
                   "identity_rows": self.identity_rows, "workspace": self.workspace}
        if inp.grammar_bitmask is not None:
            statics["bitmask"] = inp.grammar_bitmask
        statics.update({f"plan.{k}": v for k, v in self.plan.as_dict().items()})
        statics.update({f"slots.{k}": v for k, v in vars(self.tables).items()
                        if isinstance(v, torch.Tensor)})
        if self.transport is not None:
            statics["receive"] = self.transport.receive_buffer()
        if self.host_records is not None and self.host_records.tokens is not None:
            statics["tokens"] = self.host_records.tokens
        if inp.staging.device == inp.logits.device:  # on CUDA it is pinned host memory
            statics["staging"] = inp.staging
        return statics

    def step_fn(self, key: tuple) -> Callable[[], None]:
        """The whole step of `key`, as a graph captures it."""
        bucket, strategy, capacity = key[:3]
        if strategy == SHARD:
            return self._shard_fn(bucket, capacity)
        return self._replicate_fn(key)

    def sample_fn(self, key: tuple) -> Callable[[], None]:
        """The sampler call of `key`'s step, reading the full-vocabulary rows where the step's
        exchange leaves them: the transport's receive buffer (an exchange or all-gather into
        `out=None`), or the inputs' logits at tp = 1. An `unmasked` key's call has no bitmask.
        Made once per key."""
        call = self._samples.get(key)
        if call is None:
            call = self._samples[key] = self._make_sample_fn(key)
        return call

    def _make_sample_fn(self, key: tuple) -> Callable[[], None]:
        bucket, strategy, capacity = key[:3]
        inp, pb, m = self.inputs, self.plan, self.max_num_logits_per_req
        full = inp.logits if self.transport is None else self.transport.receive_buffer()
        masked = inp.grammar_bitmask is not None and not is_unmasked(key)
        common = dict(vocab_size=self.vocab_size, tables=self.tables, layout=self.layout,
                      bitmask=inp.grammar_bitmask if masked else None,
                      bitmask_enabled=inp.bitmask_on if masked else None)
        if strategy == SHARD:
            call = functools.partial(
                self.sampler, full, num_reqs=pb.local_num_reqs, req_slots=pb.local_idx_mapping,
                cu_num_logits=pb.local_cu_num_logits, seq_lens=pb.local_seq_lens,
                records=self.local_records, max_num_reqs=owned_reqs(bucket, capacity),
                draft_tokens=pb.local_draft_tokens if m > 1 else None,
                bitmask_rows=pb.local_row_src if masked else None, **common)
        else:
            call = functools.partial(
                self.sampler, full, num_reqs=inp.num_reqs, req_slots=inp.idx_mapping,
                cu_num_logits=inp.cu_num_logits, seq_lens=inp.seq_lens, records=self.records,
                max_num_reqs=bucket, draft_tokens=inp.draft_token_ids if m > 1 else None,
                bitmask_rows=self.identity_rows if masked else None, **common)
        return recorded(call) if self.replay_sampler else call

    def sampler_launches(self, keys: list[tuple]) -> list[Launch]:
        """The kernel launches of the sampler calls of `keys`' steps, recorded, not run."""
        with deferred_launches() as launches:
            for key in keys:
                self.sample_fn(key)()
        return launches

    def _shard_fn(self, bucket: int, capacity: int) -> Callable[[], None]:
        cap_reqs = owned_reqs(bucket, capacity)
        inp, pb, m = self.inputs, self.plan, self.max_num_logits_per_req
        drafts = inp.draft_token_ids if m > 1 else None
        transport, agree = self.transport, self.divergence
        sample_owned = self.sample_fn((bucket, SHARD, capacity))

        def step():
            fetch_and_plan(inp.staged, pb, tp_rank=self.tp_rank,
                           gather_stride=cap_reqs + self.digest_rows,
                           max_num_logits_per_req=m, draft_token_ids=drafts, max_reqs=bucket)
            # Fills the transport's receive buffer, which `sample_owned` reads.
            transport.exchange(pb, inp.logits, None, capacity, fenced=False, agree=agree)
            sample_owned()
            transport.gather(pb, self.local_records, self.records, cap_reqs, bucket,
                             done=inp.staged, agree=agree)

        return step

    def _replicate_fn(self, key: tuple) -> Callable[[], None]:
        bucket = key[0]
        rows = bucket * self.max_num_logits_per_req
        inp, transport, agree = self.inputs, self.transport, self.divergence
        sample_all = self.sample_fn(key)
        # At tp = 1 the sampler's scan comes next, a programmatic dependent when the engine
        # launches so.
        lead_scan = self.programmatic_launch and transport is None

        def step():
            inp.fetch(bucket, pdl_next=lead_scan)  # a step of at most its bucket's requests
            if transport is not None:  # fills the receive buffer `sample_all` reads
                transport.all_gather_vocab(inp.logits, None, rows, fenced=False, agree=agree)
            sample_all()
            if transport is None:
                self.host_records.publish(bucket)  # the records to the host, then the done word
            else:
                transport.close(done=inp.staged, agree=agree)

        return step


def owned_reqs(bucket: int, capacity: int) -> int:
    """The request bound of a shard step's local sampler: a rank owns at most `capacity` rows."""
    return max(1, min(bucket, capacity))
