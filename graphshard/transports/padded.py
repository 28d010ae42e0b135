"""The padded exchange on torch.distributed: `gloo` on CPU tensors, `nccl` on CUDA tensors.

Equal-split collectives need host-known sizes, so every destination gets a fixed `capacity` rows:
the sender gathers `send_rows[owner_row_offsets[d] + j]` for j < capacity (rows past the owner's
count are the next owners' rows, or clamped copies past the last one: real data, never read),
one `all_to_all_single` moves the
[T, capacity, vocab_shard] block, and one strided copy interleaves the vocab shards.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from graphshard.transports.digest import DIGEST_INT32
from graphshard.plan.layout import PlanBuffers
from graphshard.transports.base import Transport, all_gather_single, finish


class PaddedTransport(Transport):
    """Capacity-padded all-to-all + all-gather; `name` is "gloo" on CPU and "nccl" on CUDA."""

    def __init__(self, group, device, *, timeout_s: float = 60.0):
        super().__init__(group, device, timeout_s=timeout_s)
        self.name = "nccl" if self.device.type == "cuda" else "gloo"
        self._timeout = timedelta(seconds=self.timeout_s)

    def _allocate(self):
        t, r, vs = self.tp_size, self.max_num_rows, self.vocab_shard
        dev, dt = self.device, self.logits_dtype
        self._arange = torch.arange(r, dtype=torch.int32, device=dev)
        self._send_idx = torch.zeros(t * r, dtype=torch.int32, device=dev)  # [T, capacity] flat
        self._send_src = torch.zeros(t * r, dtype=torch.int32, device=dev)  # batch rows, same shape
        self._send = torch.zeros(t * r * vs, dtype=dt, device=dev)  # [T, capacity, vs] flat
        self._recv = torch.zeros(t * r * vs, dtype=dt, device=dev)  # [T, capacity, vs] flat
        self._rows_out = torch.zeros(r, t * vs, dtype=dt, device=dev)
        # A checked gather appends the step's digest to each rank's records.
        self.digest_rows = -(-DIGEST_INT32 // self.record_width)
        reqs = self.max_num_reqs + self.digest_rows
        self._records_stage = torch.zeros(reqs, self.record_width, dtype=torch.int32, device=dev)
        self._gathered = torch.zeros(t * reqs, self.record_width, dtype=torch.int32, device=dev)
        self._records_out = torch.zeros(self.max_num_reqs, self.record_width, dtype=torch.int32,
                                        device=dev)
        self._flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self._warm_up()

    def _warm_up(self):
        """Run each collective once at a small size: NCCL creates communicators and peer
        connections lazily, which must not happen inside a graph capture."""
        self._all_to_all(self._send_idx[:self.tp_size], self._send_src[:self.tp_size])
        self._all_gather(self._gathered[:self.tp_size], self._records_stage[:1])
        self.barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_buffer(self) -> torch.Tensor:
        return self._rows_out

    def output_buffer(self) -> torch.Tensor:
        return self._records_out

    def _all_to_all(self, recv: torch.Tensor, send: torch.Tensor):
        work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
        finish(work, self.device, self._timeout)

    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor):
        finish(all_gather_single(out, inp, group=self.group, async_op=True), self.device, self._timeout)

    # -- the step ---------------------------------------------------------------------------
    def exchange(self, plan: PlanBuffers, logits_shard: torch.Tensor, out: torch.Tensor | None,
                 capacity: int, *, fenced: bool = True, agree=None) -> torch.Tensor:
        self._check_logits(logits_shard)
        self._check_plan(plan)
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._check_rows_out(out, capacity)
        out = self._rows_out if out is None else out
        t, vs = self.tp_size, self.vocab_shard
        send = self._send[:t * capacity * vs].view(t * capacity, vs)
        self._pack_send(plan, logits_shard, send, capacity)
        recv = self._recv[:t * capacity * vs].view(t * capacity, vs)
        self._all_to_all(recv, send)
        self._interleave(recv, out, capacity)
        return out

    def _pack_send(self, plan: PlanBuffers, logits_shard: torch.Tensor, send: torch.Tensor,
                   capacity: int):
        """send[d, j] = logits_shard[send_rows[owner_row_offsets[d] + j]], index math on device."""
        t = self.tp_size
        pos = self._send_idx[:t * capacity].view(t, capacity)
        torch.add(plan.owner_row_offsets[:t, None], self._arange[None, :capacity], out=pos)
        # Positions past the last owner's rows land on padding entries of send_rows (row 0).
        pos.clamp_(max=plan.send_rows.shape[0] - 1)
        src = self._send_src[:t * capacity]
        torch.index_select(plan.send_rows, 0, pos.view(-1), out=src)
        torch.index_select(logits_shard, 0, src, out=send)

    def _interleave(self, blocks: torch.Tensor, out: torch.Tensor, rows: int):
        """out[j, s*vs:(s+1)*vs] = blocks[s, j] for j < rows: one strided copy."""
        t, vs = self.tp_size, self.vocab_shard
        out[:rows].unflatten(1, (t, vs)).copy_(blocks.view(t, rows, vs).transpose(0, 1))

    def gather(self, plan: PlanBuffers, records: torch.Tensor, out: torch.Tensor | None,
               capacity_reqs: int, num_out: int, *, done=None, agree=None) -> torch.Tensor:
        digest_rows = self.digest_rows if agree is not None else 0
        self._check_records(records, out, capacity_reqs, num_out, digest_rows)
        self._check_plan(plan)
        out = self._records_out if out is None else out
        rows = capacity_reqs + digest_rows
        send = self._contiguous_rows(records, rows, self._records_stage)
        if agree is not None:  # the digest rides in the records' all-gather
            agree.seal_on_device(send[capacity_reqs:])
        gathered = self._gathered[:self.tp_size * rows]
        self._all_gather(gathered, send)
        torch.index_select(gathered, 0, plan.gathered_src_indices[:num_out], out=out[:num_out])
        if agree is not None:  # judged by the kernel that ends the step, if it ends here
            agree.judge_gathered(gathered[capacity_reqs:], rows * self.record_width, done)
        elif done is not None:
            done.signal_done()
        return out

    def all_gather_vocab(self, logits_shard: torch.Tensor, out: torch.Tensor | None,
                         num_rows: int, *, fenced: bool = True, agree=None) -> torch.Tensor:
        self._check_logits(logits_shard, num_rows)
        self._check_rows_out(out, num_rows, "num_rows")
        out = self._rows_out if out is None else out
        t, vs = self.tp_size, self.vocab_shard
        stage = self._send[:num_rows * vs].view(num_rows, vs)
        blocks = self._recv[:t * num_rows * vs].view(t * num_rows, vs)
        self._all_gather(blocks, self._contiguous_rows(logits_shard, num_rows, stage))
        self._interleave(blocks, out, num_rows)
        return out

    @staticmethod
    def _contiguous_rows(t: torch.Tensor, rows: int, stage: torch.Tensor) -> torch.Tensor:
        """t[:rows] as a contiguous tensor: a view when it already is, else a copy into `stage`."""
        if t[:rows].is_contiguous():
            return t[:rows]
        stage = stage[:rows]
        stage.copy_(t[:rows])
        return stage

    def barrier(self):
        if self.device.type == "cpu":
            finish(dist.barrier(group=self.group, async_op=True), self.device, self._timeout)
        else:
            # dist.barrier() syncs the host; a one-element all-reduce can sit inside a graph.
            dist.all_reduce(self._flag, group=self.group)
