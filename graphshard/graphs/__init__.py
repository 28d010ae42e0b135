"""Graph backends and the per-bucket graph manager.

- `manager`: `GraphManager` (one captured graph per key, the bucket table, the too-large check);
- `cuda`: CUDA graphs; `emulated`: the CPU backend that refuses host syncs and shape changes
  inside a captured step (`StaticBuffers` registers the memory a step may use);
- `make`: `make_backend`, the backend a config value names.
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "cuda": ("CudaGraphBackend",),
    "emulated": ("EmulatedGraph", "EmulatedGraphBackend", "GraphSafetyError", "StaticBuffers"),
    "make": ("make_backend",),
    "manager": ("BatchTooLargeError", "GraphBackend", "GraphManager", "GraphStats", "bucket_of",
                "build_bucket_table"),
})
