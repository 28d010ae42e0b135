"""The memory a p2p transport's kernels store into: one buffer per rank, mapped by every peer.

`SymmetricMemory` (CUDA: torch symmetric memory, unicast, multicast off) and `SharedFileMemory`
(CPU: shared file mappings, for the interpreter) both hand out, per `allocate`, this rank's
tensor and the address of every rank's copy, in rank order. `p2p_unavailable_reason` says, the
same on every rank, why a group cannot map its peers' memory.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile

import torch
import torch.distributed as dist


# -- peer memory --------------------------------------------------------------------------------
class SymmetricMemory:
    """CUDA: torch symmetric memory, CUDA backend; peers' buffers mapped by address (unicast)."""

    def __init__(self, group, device):
        import torch.distributed._symmetric_memory as symm_mem

        self._symm_mem = symm_mem
        self.group, self.device = group, device
        self.rank = dist.get_rank(group)
        self._handles = []

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        t = self._symm_mem.empty(*shape, dtype=dtype, device=self.device)
        hdl = self._symm_mem.rendezvous(t, self.group.group_name)
        self._handles.append(hdl)
        bases = list(hdl.buffer_ptrs)
        # Depending on the release, handles carry the allocation base or the tensor's address;
        # allocations are symmetric, so the offset is the same on every rank.
        offset = t.data_ptr() - bases[self.rank]
        return t, [b + offset for b in bases]

    def finish(self):
        pass


class SharedFileMemory:
    """CPU: one shared file mapping per rank and buffer, mapped by every rank of the host."""

    def __init__(self, group, device):
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        dirs = [None] * self.world_size
        mine = tempfile.mkdtemp(prefix="graphshard-p2p-") if self.rank == 0 else None
        dist.all_gather_object(dirs, mine, group=group)
        self._dir = dirs[0]
        self._count = 0
        self._maps = []  # every mapping stays alive as long as the transport

    def _path(self, index: int, rank: int) -> str:
        return os.path.join(self._dir, f"buf{index}.rank{rank}")

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
        index, numel = self._count, math.prod(shape)
        self._count += 1
        mine = torch.from_file(self._path(index, self.rank), shared=True, size=numel, dtype=dtype)
        dist.barrier(group=self.group)
        maps = [mine if r == self.rank else
                torch.from_file(self._path(index, r), shared=True, size=numel, dtype=dtype)
                for r in range(self.world_size)]
        self._maps.append(maps)
        return mine.view(shape), [m.data_ptr() for m in maps]

    def finish(self):
        dist.barrier(group=self.group)  # everyone has mapped everything; the files can go
        if self.rank == 0:
            shutil.rmtree(self._dir, ignore_errors=True)


def _local_reason(device: torch.device) -> str | None:
    if device.type == "cpu":
        if os.environ.get("TRITON_INTERPRET") != "1":
            return "on CPU the p2p kernels need the Triton interpreter (TRITON_INTERPRET=1)"
        return None
    if device.type != "cuda":
        return f"device type {device.type} is not supported"
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        return f"torch symmetric memory is unavailable ({e})"
    get_backend = getattr(symm_mem, "get_backend", None)
    set_backend = getattr(symm_mem, "set_backend", None)
    try:
        if get_backend is not None and set_backend is not None and get_backend(device) != "CUDA":
            set_backend("CUDA")
    except Exception as e:  # noqa: BLE001 - any failure here means: use another transport
        return f"cannot select the CUDA symmetric memory backend ({e})"
    return None


def p2p_unavailable_reason(group, device: torch.device) -> str | None:
    """Why the p2p transport cannot run here, or None. A collective: every rank gets the same
    answer, so no rank sets up symmetric memory that its peers will not rendezvous with."""
    group = group if group is not None else dist.group.WORLD
    world_size = dist.get_world_size(group)
    infos = [None] * world_size
    dist.all_gather_object(infos, (socket.gethostname(), device.index, _local_reason(device)),
                           group=group)
    reasons = [f"rank {r}: {why}" for r, (_, _, why) in enumerate(infos) if why]
    if reasons:
        return "; ".join(reasons)
    if len({host for host, _, _ in infos}) > 1:
        return "the ranks span several hosts"
    if device.type != "cuda":
        return None
    blocked = [idx for _, idx, _ in infos
               if idx != device.index and not torch.cuda.can_device_access_peer(device.index, idx)]
    verdicts = [None] * world_size
    dist.all_gather_object(verdicts, blocked, group=group)
    blocked_pairs = [(r, idx) for r, b in enumerate(verdicts) for idx in b]
    if blocked_pairs:
        return f"no peer access between (rank, cuda device) pairs {blocked_pairs}"
    return None
