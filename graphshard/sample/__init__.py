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

# name -> module that defines it, imported on first use.
_LAZY = {
    "SamplingParams": "graphshard.sample.params",
    "SlotTables": "graphshard.sample.params",
    "sample": "graphshard.sample.kernels",
    "SamplerWorkspace": "graphshard.sample.kernels",
    "sample_ref": "graphshard.sample.reference",
    "RecordLayout": "graphshard.sample.records",
    "SamplerOutput": "graphshard.sample.records",
    "HostOutput": "graphshard.sample.records",
    "unpack": "graphshard.sample.records",
    "unpack_host": "graphshard.sample.records",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
