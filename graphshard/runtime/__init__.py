"""Where kernels run, shared by every stage: the device a rank uses (`devices`), the one way to
launch a Triton kernel (`launch`) and the driver's byte copies (`memcpy`)."""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "devices": ("check_kernels_run_on", "resolve_device"),
    "launch": ("Launch", "bound", "bound_arguments", "check_int32_vector", "compile_launches",
               "compile_workers", "compiles_kernels", "deferred_launches", "distinct_variants",
               "launch", "recorded", "specialization_key"),
    "memcpy": ("DeviceCopier", "device_copier", "host_copier"),
})
