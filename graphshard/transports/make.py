"""Which transport a config value names, with p2p's fallback when it cannot run."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from graphshard.config import TRANSPORTS
from graphshard.runtime.devices import resolve_device
from graphshard.transports.base import Transport
from graphshard.transports.p2p import P2PTransport
from graphshard.transports.peer_memory import p2p_unavailable_reason
from graphshard.transports.padded import PaddedTransport

logger = logging.getLogger(__name__)


def make_transport(kind: str, group: dist.ProcessGroup | None = None,
                   device: torch.device | str | None = None, *, timeout_s: float = 60.0,
                   **options) -> Transport:
    """Build a transport (call its `setup` next). A collective for "p2p" and "auto": every rank of
    `group` must call it. "auto" = p2p when CUDA ranks share a node with working symmetric memory,
    else nccl on CUDA, else gloo on CPU. "p2p" falls back to nccl (gloo on CPU) with a logged reason
    when it cannot run; on CPU it needs the Triton interpreter. `timeout_s` bounds the transport's
    waits on peers; `options` go to P2PTransport."""
    if kind not in TRANSPORTS:
        raise ValueError(f"transport kind must be one of {', '.join(TRANSPORTS)}, got {kind!r}")
    device = resolve_device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"transports run on cpu or cuda devices, got {device}")
    if kind == "gloo" and device.type != "cpu":
        raise ValueError(f"the gloo transport moves CPU tensors; got device {device}")
    if kind == "nccl" and device.type != "cuda":
        raise ValueError(f"the nccl transport moves CUDA tensors; got device {device}")
    if kind in ("gloo", "nccl") or (kind == "auto" and device.type == "cpu"):
        return PaddedTransport(group, device, timeout_s=timeout_s)

    reason = p2p_unavailable_reason(group, device)
    if reason is None:
        return P2PTransport(group, device, timeout_s=timeout_s, **options)
    fallback = PaddedTransport(group, device, timeout_s=timeout_s)
    log = logger.warning if kind == "p2p" else logger.info
    log("p2p transport unavailable (%s); using %s", reason, fallback.name)
    return fallback
