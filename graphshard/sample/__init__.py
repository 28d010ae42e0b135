"""Sample: the owned rows sampled into one packed record per request.

- `params`: per-request `SamplingParams` and the per-slot device tables (`SlotTables`);
- `kernels`: the sampler's two kernels and their launcher (`sample`, `SamplerWorkspace`);
- `rows`, `candidates`, `resolve`: the kernels' device functions (whole-row passes, the candidate
  pool, settling a row from both); `workspace`: the kernels' static scratch;
- `rng`: counter-based random numbers, device and NumPy versions;
- `records`: the packed per-request record (`RecordLayout`) and its views (`SamplerOutput`,
  `HostOutput`);
- `reference`: the float64 NumPy reference of `sample` (`sample_ref`).
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "params": ("SamplingParams", "SlotTables"),
    "kernels": ("SamplerWorkspace", "sample"),
    "records": ("HostOutput", "RecordLayout", "SamplerOutput", "unpack", "unpack_host"),
    "reference": ("sample_ref",),
})
