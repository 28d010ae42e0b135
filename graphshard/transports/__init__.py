"""Transports: move logits rows to their owners and gather records back (p2p, nccl, gloo).

- `base`: the `Transport` interface and the capacity tiers of padded exchanges;
- `p2p`: symmetric-memory pushes with device counts, into the peers' buffers that `peer_memory`
  maps; `padded`: NCCL or gloo collectives over padded buffers;
- `digest`: the divergence check's digest and judge on the device;
- `make`: `make_transport`, the transport a config value names.
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "base": ("Transport", "doubling_tiers", "pick_tier"),
    "make": ("make_transport",),
    "p2p": ("P2PTransport",),
    "peer_memory": ("p2p_unavailable_reason",),
    "padded": ("PaddedTransport",),
})
