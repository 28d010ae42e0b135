"""Peer-to-peer transport: Triton kernels store straight into peers' memory (one node).

Each rank maps every peer's receive buffer, record buffer and signal pad (torch symmetric memory
on CUDA, multicast off). A sender pushes only the real rows, counts read on the device: row j of
owner d's block goes straight to d's full-vocabulary buffer at row j, columns
[rank*vocab_shard, (rank+1)*vocab_shard), so the owner-sort gather and the vocab interleave
happen in the transfer. The record gather is the same trick: each owner stores a record into
every rank's output buffer at its batch position.

Ordering. A barrier is per program id: program p of every rank raises a flag on every rank's pad
(release, system scope) and waits for every rank's flag for p on its own pad, consuming it (CAS
1 -> 0, acquire). A rank passes a barrier only once every peer has arrived at it, and a peer
arrives only after every earlier kernel on its stream has finished. So once past a barrier, a
rank may overwrite whatever its peers read, or waited on, before that barrier.

A push's end barrier says that what it stored has landed. Its start barrier says that the peers
no longer read the buffer it is about to overwrite. Inside an engine step the push skips the
start barrier (`fenced=False`) because every step ends *closed*: its last transport call ends
with a barrier placed after the step's last read of what it was sent.
- shard: plan -> row push (end barrier) -> sampler -> record push (end barrier). The record push
  runs after the sampler on every rank, so its end barrier closes the step. Its own start
  barrier is the row push's end barrier: every peer has started this step, so it is done
  reading the previous step's records (a host copy enqueued before the step included).
- replicate: all-gather push (end barrier) -> sampler -> `close()`, a record push with no
  records on its own channel, whose end barrier closes the step.
A rank that writes step k's rows has passed the close of step k - 1, which no peer reaches
before its sampler of step k - 1 has finished: one receive buffer suffices. (Double-buffering it
by a device-side step parity could spare only replicate's close: the shard step needs its
record push's end barrier anyway. And the sampler reads the rows through a pointer frozen into
the graph, which cannot follow a parity the device picks.)
The pads stay consistent by the same argument: a rank raises a flag again only after passing a
barrier that its peer reaches after consuming the first one (a step's push end barrier and its
close alternate; `barrier()` and fenced calls carry both phases). Every kernel leaves the pads
at zero, so graph replays need no host-side epoch. What runs on the transport keeps this rule:
- its own set-up ends with a two-phase barrier, so the first step may push unfenced;
- warm-up, capture, `auto`'s timing runs and eager steps above the largest bucket all run the
  same closed step functions; captures are separated by two-phase barriers;
- a batch refused by the checks launches nothing on any rank; a rank that refuses its own
  tensors stops stepping, and like any step that fails (a barrier that gave up, an exception
  while issuing), this breaks the transport for good: the engine never steps again.

Faults. A peer that died or stopped stepping never raises its flag, so every wait is bounded:
past `timeout_s` the program gives up, records (phase, peer) in a status word (a device word
the later barriers read so they give up at once, and a pinned host copy the engine reads
without a device sync) and lets the kernel finish. The pads are then in an unknown state: the
transport is broken for good and `fault()` says why. Every decision a barrier branches on (the
flag, the clock, the status word) is one value per program, so its warps never part ways on
it (they meet at block-wide barriers inside the loop).

Divergence check (`agree`, `graphshard.engine.divergence`). The last program of the step's row
push computes this rank's 32-byte digest (the staged header's words and a hash of the fetched
arrays, all in device memory) and stores it into every
rank's digest slot before the push's end barrier; the last program of the kernel that ends the
step judges the landed digests before that kernel's end barrier. No
peer pushes the next step's digest before this rank has arrived at that barrier, so one slot per
rank suffices, and the verdict is written before the step's done word.

The record push can also end the engine's step (`done`): the last of its programs past the end
barrier writes the step's done word (`graphshard.plan.staging`), so the step needs no kernel for it.

On CPU the same kernels run under the Triton interpreter against shared-file mappings, which lets
the CPU suite run the real kernels, barriers included, across processes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from graphshard.transports.digest import DIGEST_SIZE, DIGEST_WORDS, judge, load_digest
from graphshard.runtime.launch import launch
from graphshard.plan.layout import PlanBuffers
from graphshard.plan.staging import signal_done
from graphshard.transports.base import Transport
from graphshard.transports.peer_memory import SharedFileMemory, SymmetricMemory
from graphshard.transports.signals import sync

# Signal-pad channels: two phases (start, end) per kind of kernel.
_CH_ROWS, _CH_RECORDS, _CH_BARRIER, _CH_CLOSE = 0, 2, 4, 6
_NUM_CHANNELS = 8
_MAX_ROW_BLOCK = 4096
_PHASES = ("row push start", "row push end", "record push start", "record push end",
           "barrier phase 1", "barrier phase 2", "step close start", "step close end")

@triton.jit(do_not_specialize=["num_rows", "timeout_ns"])
def _push_rows_kernel(
    src,  # (pointer to [>= rows, VOCAB_SHARD] this rank's vocab columns, batch row order, stride)
    send_rows_ptr,  # [R] owner-sorted batch rows (exchange)
    row_offsets_ptr,  # [T+1] owner_row_offsets (exchange)
    num_rows,  # rows every rank receives (all-gather)
    dst_ptrs_ptr,  # [T] int64: each rank's receive buffer [max_num_rows, T * VOCAB_SHARD]
    signal_ptrs_ptr,  # [T] int64: each rank's signal pad [channels, MAX_BLOCKS, T]
    status_ptr,  # [4] int32: fault status (`graphshard.transports.signals`)
    digest,  # AGREE: (the step's fetched inputs, int64 (graphshard.transports.digest.load_digest),
    #          their layout's N, [T] int64: each rank's digest buffer [T, DIGEST_WORDS] int64)
    rank,
    timeout_ns,
    VOCAB_SHARD: tl.constexpr,
    WORLD_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    CHANNEL: tl.constexpr,
    ALL_ROWS: tl.constexpr,
    FENCE: tl.constexpr,  # start barrier; off inside a step that follows a closed one
    AGREE: tl.constexpr,  # push this rank's step digest too (the divergence check)
    BLOCK: tl.constexpr,
):
    WORLD_POW2: tl.constexpr = triton.next_power_of_2(WORLD_SIZE)
    src_ptr, src_row_stride = src
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    ok = True
    if FENCE:
        ok = sync(signal_ptrs_ptr, status_ptr, CHANNEL * MAX_BLOCKS + pid, rank, timeout_ns,
                  MAX_BLOCKS, WORLD_SIZE)
    if AGREE:
        # 32 bytes to every rank, landed by this kernel's end barrier. The last program has the
        # least row work at small batches.
        if pid == num_programs - 1:
            _push_digest(digest, rank, WORLD_SIZE)

    num_chunks = (VOCAB_SHARD + BLOCK - 1) // BLOCK
    peers = tl.arange(0, WORLD_POW2)
    if ALL_ROWS:
        total = num_rows * WORLD_SIZE
    else:
        total = tl.load(row_offsets_ptr + WORLD_SIZE)
        row_ends = tl.load(row_offsets_ptr + 1 + peers, mask=peers < WORLD_SIZE, other=2**31 - 1)
    dst_col = rank * VOCAB_SHARD
    cols0 = tl.arange(0, BLOCK)
    # Work items are (row, column chunk) pairs so a single long row still spreads over programs.
    item = pid
    while item < total * num_chunks:
        k = item // num_chunks
        cols = (item % num_chunks) * BLOCK + cols0
        mask = cols < VOCAB_SHARD
        if ALL_ROWS:
            dst_rank = k // num_rows
            dst_row = k % num_rows
            src_row = dst_row
        else:
            dst_rank = tl.sum((row_ends <= k).to(tl.int32), axis=0)
            dst_row = k - tl.load(row_offsets_ptr + dst_rank)
            src_row = tl.load(send_rows_ptr + k)
        vals = tl.load(src_ptr + src_row.to(tl.int64) * src_row_stride + cols, mask=mask)
        # Symmetric buffers are allocation-aligned: the hint lets the stores vectorize.
        dst = tl.load(dst_ptrs_ptr + dst_rank).to(tl.pointer_type(src_ptr.dtype.element_ty))
        dst = tl.multiple_of(dst, 16)
        tl.store(dst + dst_row.to(tl.int64) * (WORLD_SIZE * VOCAB_SHARD) + dst_col + cols, vals,
                 mask=mask)
        item += num_programs

    if ok:
        sync(signal_ptrs_ptr, status_ptr, (CHANNEL + 1) * MAX_BLOCKS + pid, rank, timeout_ns,
             MAX_BLOCKS, WORLD_SIZE)


@triton.jit
def _push_digest(digest, rank, WORLD_SIZE: tl.constexpr):
    meta_ptr, max_num_reqs, digest_ptrs_ptr = digest
    words = tl.arange(0, DIGEST_SIZE)
    words_of_step = load_digest(meta_ptr, max_num_reqs)
    for peer in tl.static_range(WORLD_SIZE):
        dst = tl.load(digest_ptrs_ptr + peer).to(tl.pointer_type(tl.int64))
        tl.store(dst + rank * DIGEST_SIZE + words, words_of_step)


@triton.jit(do_not_specialize=["timeout_ns"])
def _push_records_kernel(
    records,  # (pointer to [>= local_num_reqs, WIDTH] int32, local order, row stride)
    local_num_reqs_ptr,  # [1]
    local_req_indices_ptr,  # [N] batch index of each local request
    dst_ptrs_ptr,  # [T] int64: each rank's output buffer [max_num_reqs, WIDTH]
    signal_ptrs_ptr,  # [T] int64: each rank's signal pad
    status_ptr,  # [4] int32: fault status
    arrivals_ptr,  # [1] int32: programs past the end barrier (DONE); 0 between kernels
    done,  # DONE: Staging.done_args(): (the done word's address, meta's step, last step)
    verdict,  # AGREE: (this rank's digest buffer [T, DIGEST_WORDS] int64, filled by the row
    #           push; the address of graphshard.engine.divergence's verdict rows)
    rank,
    timeout_ns,
    WIDTH: tl.constexpr,
    REQ_TILE: tl.constexpr,
    WORLD_SIZE: tl.constexpr,
    MAX_BLOCKS: tl.constexpr,
    CHANNEL: tl.constexpr,
    FENCE_BEFORE: tl.constexpr,
    DONE: tl.constexpr,
    AGREE: tl.constexpr,  # judge the digests the step's row push delivered (needs DONE)
):
    WIDTH_POW2: tl.constexpr = triton.next_power_of_2(WIDTH)
    records_ptr, records_row_stride = records
    done_address_ptr, done_seq_ptr, done_last_ptr = done
    digests_ptr, verdicts_address_ptr = verdict
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    ok = True
    if FENCE_BEFORE:
        ok = sync(signal_ptrs_ptr, status_ptr, CHANNEL * MAX_BLOCKS + pid, rank, timeout_ns,
                  MAX_BLOCKS, WORLD_SIZE)

    num_local = tl.load(local_num_reqs_ptr)
    num_tiles = (num_local + REQ_TILE - 1) // REQ_TILE
    reqs0 = tl.arange(0, REQ_TILE)
    cols = tl.arange(0, WIDTH_POW2)
    item = pid
    while item < num_tiles * WORLD_SIZE:
        dst_rank = item % WORLD_SIZE
        reqs = (item // WORLD_SIZE) * REQ_TILE + reqs0
        live = reqs < num_local
        batch_rows = tl.load(local_req_indices_ptr + reqs, mask=live, other=0)
        mask = live[:, None] & (cols[None, :] < WIDTH)
        vals = tl.load(records_ptr + reqs.to(tl.int64)[:, None] * records_row_stride + cols[None, :],
                       mask=mask)
        dst = tl.load(dst_ptrs_ptr + dst_rank).to(tl.pointer_type(tl.int32))
        tl.store(dst + batch_rows.to(tl.int64)[:, None] * WIDTH + cols[None, :], vals, mask=mask)
        item += num_programs

    if AGREE:
        # Before the end barrier: no peer can push the next step's digest until this rank has
        # arrived there. A program that gave up leaves the verdict to the fault. The last
        # program has the fewest records to push at small batches.
        if ok & (pid == num_programs - 1):
            judge(digests_ptr, 2 * DIGEST_SIZE, verdicts_address_ptr, done_seq_ptr, WORLD_SIZE)
    if ok:
        sync(signal_ptrs_ptr, status_ptr, (CHANNEL + 1) * MAX_BLOCKS + pid, rank, timeout_ns,
             MAX_BLOCKS, WORLD_SIZE)
    if DONE:
        # Each program's end barrier covers the peers' programs of its id; the step is done
        # once every program is past its own. The last one writes the done word and re-arms the
        # count (the next kernel to use it runs after this one). A program that gave up counts
        # too: the host then finds the fault next to the done word.
        if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel", scope="gpu") == num_programs - 1:
            tl.atomic_xchg(arrivals_ptr, 0, sem="relaxed", scope="gpu")
            signal_done(done_address_ptr, done_seq_ptr, done_last_ptr)


@triton.jit(do_not_specialize=["timeout_ns"])
def _barrier_kernel(signal_ptrs_ptr, status_ptr, rank, timeout_ns, WORLD_SIZE: tl.constexpr,
                    MAX_BLOCKS: tl.constexpr, CHANNEL: tl.constexpr):
    # Two phases, so a fast rank cannot re-raise a flag its peer has not consumed yet.
    if sync(signal_ptrs_ptr, status_ptr, CHANNEL * MAX_BLOCKS, rank, timeout_ns, MAX_BLOCKS,
            WORLD_SIZE):
        sync(signal_ptrs_ptr, status_ptr, (CHANNEL + 1) * MAX_BLOCKS, rank, timeout_ns,
             MAX_BLOCKS, WORLD_SIZE)


# -- the transport ------------------------------------------------------------------------------
class P2PTransport(Transport):
    """Pushes only the real rows into peers' mapped buffers; reads every count on the device.

    `exchange`/`all_gather_vocab` fill `receive_buffer()` and `gather` fills `output_buffer()`
    (both symmetric); pass `out` to get a copy. A `gather` or `close` issued right after an
    exchange, all-gather or barrier (nothing but local work in between, as in one step) reuses
    that op's end barrier as its start barrier. `fenced=False` drops a push's start barrier (see
    the module docstring for when that is sound); `done` fuses a step's done signal into the
    kernel that ends it.
    """

    name = "p2p"

    def __init__(self, group, device, *, num_blocks: int | None = None, timeout_s: float = 60.0):
        super().__init__(group, device, timeout_s=timeout_s)
        self._timeout_ns = int(self.timeout_s * 1e9)
        if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, int)
                                       or num_blocks < 1):
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if self.device.type == "cuda":
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            # Every program of a kernel must be resident at once (they wait on their peers'
            # programs): two small programs per SM fit. Measured on 2xH200 (exchange benchmark):
            # 256 programs beat 64 at 1 row (21 vs 29 us) and at 155 MB (544 vs 601 us).
            self.num_blocks = num_blocks or min(256, max(1, 2 * sms - 8))
            self._memory_cls = SymmetricMemory
        else:
            # The interpreter runs programs one after another: few programs keep it quick.
            self.num_blocks = num_blocks or 2
            self._memory_cls = SharedFileMemory
        self._peers_synced = False

    def _allocate(self):
        # The grid and the signal pads are sized by num_blocks: every rank must use the same.
        blocks = torch.tensor([self.num_blocks], dtype=torch.int64, device=self.device)
        dist.all_reduce(blocks, op=dist.ReduceOp.MIN, group=self.group)
        self.num_blocks = int(blocks[0])
        memory = self._memory_cls(self.group, self.device)
        self._recv, recv_ptrs = memory.allocate((self.max_num_rows, self.vocab), self.logits_dtype)
        self._records_out, out_ptrs = memory.allocate((self.max_num_reqs, self.record_width),
                                                      torch.int32)
        self._signals, signal_ptrs = memory.allocate((_NUM_CHANNELS, self.num_blocks, self.tp_size),
                                                     torch.int32)
        self._digests, digest_ptrs = memory.allocate((self.tp_size, DIGEST_WORDS), torch.int64)
        # Zeroed before any peer can raise a flag; zeroed rows also keep never-written rows defined.
        for t in (self._recv, self._records_out, self._signals, self._digests):
            t.zero_()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        memory.finish()
        dist.barrier(group=self.group)
        self._memory = memory  # keeps the mappings (and their handles) alive
        as_table = lambda ptrs: torch.tensor(ptrs, dtype=torch.int64, device=self.device)  # noqa: E731
        self._recv_ptrs, self._out_ptrs = as_table(recv_ptrs), as_table(out_ptrs)
        self._signal_ptrs = as_table(signal_ptrs)
        self._digest_ptrs = as_table(digest_ptrs)
        self._no_rows = torch.zeros(self.tp_size + 1, dtype=torch.int32, device=self.device)
        self._no_records = torch.zeros(1, self.record_width, dtype=torch.int32, device=self.device)
        self._no_done = torch.zeros(2, dtype=torch.int64, device=self.device)  # DONE off: unread
        self._arrivals = torch.zeros(1, dtype=torch.int32, device=self.device)
        self._allocate_status()
        self._row_block = min(_MAX_ROW_BLOCK, triton.next_power_of_2(self.vocab_shard))
        width_pow2 = triton.next_power_of_2(self.record_width)
        self._req_tile = max(1, min(32, 2048 // width_pow2))
        self._record_blocks = min(self.num_blocks, 16)
        self._warm_up()

    def _allocate_status(self):
        """The fault status word: [1 + phase, peer, host copy's address] on the device, and the
        host copy (pinned on CUDA, so the kernels write it and the host reads it with no copy)."""
        self._status_host = torch.zeros(2, dtype=torch.int32, pin_memory=self.device.type == "cuda")
        self._status_view = self._status_host.numpy()
        status = torch.zeros(4, dtype=torch.int32)
        status[2:].view(torch.int64)[0] = self._status_host.data_ptr()
        self._status = status.to(self.device)

    def fault(self) -> str | None:
        """Reads the host copy of the status: call after the kernels of interest have finished."""
        if self._status_view[0] == 0:  # every step on the host's hot path: one NumPy read
            return None
        phase, peer = (int(v) for v in self._status_view)
        return (f"p2p {_PHASES[phase - 1]} barrier on rank {self.tp_rank} gave up after "
                f"{self.timeout_s:g} s waiting for rank {peer}")

    def _warm_up(self):
        """Compile the kernel variants a step uses and run each once with empty counts, before
        any capture (the fused done signal compiles in the engine's own warm-up runs). The order
        keeps every unfenced push right after a closing call."""
        zeros, records = self._no_rows, self._no_records
        # Laid out like an engine's logits and records buffers, so the variants compiled here
        # are the ones a capture later launches.
        logits = torch.zeros(1, self.vocab_shard, dtype=self.logits_dtype, device=self.device)
        self._launch_barrier()
        self._push_rows(logits, zeros, zeros, num_rows=0, all_rows=False, fenced=True)
        self._push_records(records, zeros, zeros)  # start barrier reused from the push
        self._push_records(records, zeros, zeros)  # its own start barrier
        self._push_rows(logits, zeros, zeros, num_rows=0, all_rows=False, fenced=False)
        self._push_records(records, zeros, zeros)
        self._push_rows(logits, zeros, zeros, num_rows=0, all_rows=True, fenced=True)
        self._close(None)
        self._push_rows(logits, zeros, zeros, num_rows=0, all_rows=True, fenced=False)
        self._close(None)
        self._launch_barrier()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def capacity_tiers(self, bucket_rows: int) -> tuple[int, ...]:
        if bucket_rows < 1:
            raise ValueError(f"bucket_rows must be >= 1, got {bucket_rows}")
        return (bucket_rows,)  # counts are read on the device: nothing is padded

    def receive_buffer(self) -> torch.Tensor:
        return self._recv

    def output_buffer(self) -> torch.Tensor:
        return self._records_out

    # -- launchers --------------------------------------------------------------------------
    def _push_rows(self, logits_shard, send_rows, row_offsets, *, num_rows: int, all_rows: bool,
                   fenced: bool, agree=None):
        digest = (agree.header, agree.staging.max_num_reqs, self._digest_ptrs) \
            if agree is not None else (self._no_done, 0, self._no_done)
        launch(_push_rows_kernel, (self.num_blocks,),
               (logits_shard, logits_shard.stride(0)), send_rows, row_offsets, num_rows,
               self._recv_ptrs, self._signal_ptrs, self._status, digest, self.tp_rank,
               self._timeout_ns,
               VOCAB_SHARD=self.vocab_shard, WORLD_SIZE=self.tp_size, MAX_BLOCKS=self.num_blocks,
               CHANNEL=_CH_ROWS, ALL_ROWS=all_rows, FENCE=fenced, AGREE=agree is not None,
               BLOCK=self._row_block,
               num_warps=8 if self._row_block >= 2048 else 4)
        self._peers_synced = True

    def _push_records(self, records, local_num_reqs, local_req_indices, *, done=None, agree=None,
                      channel: int = _CH_RECORDS, grid: int | None = None):
        if agree is not None and done is None:
            raise ValueError("the divergence check judges at the step's end: pass done too")
        done_args = done.done_args() if done is not None else (self._no_done,) * 3
        verdict = (self._digests, agree.verdicts_address) if agree is not None \
            else (self._no_done,) * 2
        launch(_push_records_kernel, (grid or self._record_blocks,),
               (records, records.stride(0)), local_num_reqs, local_req_indices,
               self._out_ptrs, self._signal_ptrs, self._status, self._arrivals, done_args,
               verdict, self.tp_rank, self._timeout_ns,
               WIDTH=self.record_width, REQ_TILE=self._req_tile, WORLD_SIZE=self.tp_size,
               MAX_BLOCKS=self.num_blocks,
               CHANNEL=channel, FENCE_BEFORE=not self._peers_synced, DONE=done is not None,
               AGREE=agree is not None)
        self._peers_synced = False

    def _close(self, done, agree=None):
        # A record push with nothing to push: its end barrier on its own channel, and `done`.
        self._push_records(self._no_records, self._no_rows, self._no_rows, done=done, agree=agree,
                           channel=_CH_CLOSE, grid=1)

    # -- the step ---------------------------------------------------------------------------
    def exchange(self, plan: PlanBuffers, logits_shard: torch.Tensor, out: torch.Tensor | None = None,
                 capacity: int | None = None, *, fenced: bool = True, agree=None) -> torch.Tensor:
        self._check_logits(logits_shard)
        self._check_plan(plan)
        capacity = self.max_num_rows if capacity is None else capacity
        self._check_rows_out(out, capacity)
        self._push_rows(logits_shard, plan.send_rows, plan.owner_row_offsets, num_rows=0,
                        all_rows=False, fenced=fenced, agree=agree)
        return self._deliver(self._recv, out, capacity)

    def gather(self, plan: PlanBuffers, records: torch.Tensor, out: torch.Tensor | None = None,
               capacity_reqs: int | None = None, num_out: int | None = None, *,
               done=None, agree=None) -> torch.Tensor:
        num_out = self.max_num_reqs if num_out is None else num_out
        capacity_reqs = self.max_num_reqs if capacity_reqs is None else capacity_reqs
        self._check_records(records, out, capacity_reqs, num_out)
        self._check_plan(plan)
        self._push_records(records, plan.local_num_reqs, plan.local_req_indices, done=done,
                           agree=agree)
        return self._deliver(self._records_out, out, num_out)

    def all_gather_vocab(self, logits_shard: torch.Tensor, out: torch.Tensor | None = None,
                         num_rows: int | None = None, *, fenced: bool = True,
                         agree=None) -> torch.Tensor:
        num_rows = self.max_num_rows if num_rows is None else num_rows
        self._check_logits(logits_shard, num_rows)
        self._check_rows_out(out, num_rows, "num_rows")
        self._push_rows(logits_shard, self._no_rows, self._no_rows, num_rows=num_rows,
                        all_rows=True, fenced=fenced, agree=agree)
        return self._deliver(self._recv, out, num_rows)

    def close(self, done=None, agree=None) -> None:
        """End a step whose last push was an all-gather: one barrier after the sampler (start
        barrier reused from the push), with `done` (and the divergence verdict) fused."""
        self._check_ready()
        self._close(done, agree)

    def barrier(self):
        self._check_ready()
        self._launch_barrier()

    def _launch_barrier(self):
        launch(_barrier_kernel, (1,), self._signal_ptrs, self._status, self.tp_rank,
               self._timeout_ns, WORLD_SIZE=self.tp_size, MAX_BLOCKS=self.num_blocks,
               CHANNEL=_CH_BARRIER)
        self._peers_synced = True

    @staticmethod
    def _deliver(buffer: torch.Tensor, out: torch.Tensor | None, rows: int) -> torch.Tensor:
        if out is None or out.data_ptr() == buffer.data_ptr():
            return buffer
        out[:rows].copy_(buffer[:rows])
        return out
