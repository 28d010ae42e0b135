"""The baselines the sweep measures graphshard against.

- `EagerBatchShard`: the dynamic-shape batch sharder graphshard grew from: the plan on the host,
  fresh tensors every step, an uneven all-to-all, sampling of the owned rows, an all-gather of
  the results padded to the largest shard.
- `EagerAllGather`: today's default: all-gather the vocab shards, every rank samples every row.
- `BareAllGatherGraph`: what a user writes in twenty lines for greedy decoding: all-gather the
  vocab shards and take the argmax, captured in one CUDA graph per batch size, no engine.
- `CapturedArgmax`: the tp = 1 counterpart: the argmax of the full logits in one CUDA graph.

The eager ones use graphshard's sampler, so the comparison isolates how the step is
orchestrated; the captured ones are greedy only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from graphshard.plan.layout import owner_counts, owner_ranks
from graphshard.sample.params import SlotTables
from graphshard.sample.records import RecordLayout
from graphshard.sample.kernels import sample


def _to_device(a: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(device, non_blocking=True)


class _Baseline:
    def __init__(self, *, vocab_size: int, vocab_shard: int, layout: RecordLayout, tables: SlotTables,
                 group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.tp_size = dist.get_world_size(self.group)
        self.tp_rank = dist.get_rank(self.group)
        self.vocab_size, self.vocab_shard = vocab_size, vocab_shard
        self.layout, self.tables = layout, tables

    def _sample(self, full, idx, cu, seq_lens, device) -> torch.Tensor:
        n = idx.shape[0]
        records = torch.empty(max(n, 1), self.layout.width, dtype=torch.int32, device=device)
        sample(full, vocab_size=self.vocab_size,
               num_reqs=torch.tensor([n], dtype=torch.int32).to(device, non_blocking=True),
               req_slots=_to_device(idx, device), cu_num_logits=_to_device(cu, device),
               seq_lens=_to_device(seq_lens, device), tables=self.tables, layout=self.layout,
               records=records, max_num_reqs=n)
        return records[:n]


class EagerAllGather(_Baseline):
    def step(self, idx, cu, seq_lens, logits_shard: torch.Tensor) -> torch.Tensor:
        rows, t = logits_shard.shape[0], self.tp_size
        gathered = torch.empty(t * rows, self.vocab_shard, dtype=logits_shard.dtype, device=logits_shard.device)
        dist.all_gather_into_tensor(gathered, logits_shard, group=self.group)
        full = gathered.view(t, rows, self.vocab_shard).permute(1, 0, 2).reshape(rows, t * self.vocab_shard)
        return self._sample(full, idx, cu, seq_lens, logits_shard.device)


class EagerBatchShard(_Baseline):
    def step(self, idx, cu, seq_lens, logits_shard: torch.Tensor) -> torch.Tensor:
        device, t, r = logits_shard.device, self.tp_size, self.tp_rank
        owner = owner_ranks(idx, t)
        order = np.argsort(owner, kind="stable")
        reqs_per_owner, rows_per_owner = owner_counts(idx, cu, t)
        send_rows = np.concatenate([np.arange(cu[i], cu[i + 1]) for i in order]) if idx.size else np.zeros(0)
        local = np.flatnonzero(owner == r)
        local_rows = int(rows_per_owner[r])
        send = logits_shard.index_select(0, _to_device(send_rows, device).long())
        recv = torch.empty(t * local_rows, self.vocab_shard, dtype=logits_shard.dtype, device=device)
        dist.all_to_all_single(recv, send, output_split_sizes=[local_rows] * t,
                               input_split_sizes=rows_per_owner.tolist(), group=self.group)
        full = recv.view(t, local_rows, self.vocab_shard).permute(1, 0, 2).reshape(local_rows, t * self.vocab_shard)
        local_cu = np.concatenate([[0], np.cumsum(np.diff(cu.astype(np.int64))[local])])
        records = self._sample(full, idx[local], local_cu, seq_lens[local], device)
        width = int(reqs_per_owner.max()) if idx.size else 1
        padded = torch.zeros(width, self.layout.width, dtype=torch.int32, device=device)
        padded[: records.shape[0]] = records
        gathered = torch.empty(t * width, self.layout.width, dtype=torch.int32, device=device)
        dist.all_gather_into_tensor(gathered, padded, group=self.group)
        rank_in_owner = np.zeros(idx.shape[0], dtype=np.int64)
        for d in range(t):
            mine = np.flatnonzero(owner == d)
            rank_in_owner[mine] = np.arange(mine.shape[0])
        src = owner * width + rank_in_owner
        return gathered.index_select(0, _to_device(src, device).long())


class BareAllGatherGraph:
    """`all_gather_into_tensor` of the [n, V/T] shards, then the argmax over the real
    vocabulary, captured once for batch size n. `step()` replays it and returns the token ids."""

    def __init__(self, logits_shard: torch.Tensor, vocab_size: int, group=None):
        self.group = group if group is not None else dist.group.WORLD
        t = dist.get_world_size(self.group)
        n, vs = logits_shard.shape
        self.logits = logits_shard  # the static input: write each step's shard here
        self.gathered = torch.empty(t * n, vs, dtype=logits_shard.dtype, device=logits_shard.device)
        self.tokens = torch.empty(n, dtype=torch.int64, device=logits_shard.device)

        def step():
            dist.all_gather_into_tensor(self.gathered, self.logits, group=self.group)
            full = self.gathered.view(t, n, vs).transpose(0, 1).reshape(n, t * vs)
            torch.argmax(full[:, :vocab_size], dim=1, out=self.tokens)

        self.graph = capture(step)

    def step(self) -> torch.Tensor:
        self.graph.replay()
        return self.tokens


class CapturedArgmax:
    """The argmax of [n, V] logits (real vocabulary only), captured once for batch size n."""

    def __init__(self, logits: torch.Tensor, vocab_size: int):
        self.logits = logits  # the static input
        self.tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        self.graph = capture(lambda: torch.argmax(self.logits[:, :vocab_size], dim=1, out=self.tokens))

    def step(self) -> torch.Tensor:
        self.graph.replay()
        return self.tokens


def capture(fn) -> torch.cuda.CUDAGraph:
    """`fn` warmed up on a side stream (communicators and kernels ready), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL watchdog may query events from its own thread during capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        fn()
    torch.cuda.synchronize()
    return graph
