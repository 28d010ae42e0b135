"""Where kernels run, shared by every stage: the device a rank uses (`devices`) and the one way to
launch a Triton kernel (`launch`)."""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# name -> module that defines it, imported on first use.
_LAZY = {
    "resolve_device": "graphshard.runtime.devices",
    "check_kernels_run_on": "graphshard.runtime.devices",
    "launch": "graphshard.runtime.launch",
    "check_int32_vector": "graphshard.runtime.launch",
    "specialization_key": "graphshard.runtime.launch",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
