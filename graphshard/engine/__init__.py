"""The engine: what a decode loop holds, and what a step checks and runs around its graphs.

- `engine`: `Engine` (static buffers, per-slot state, capture and `step()`); `steps`: the step
  functions its graphs capture, one per key; `capture`: which graphs `capture()` captures and
  the sampler variants it compiles ahead of them;
- `validate`: host-side checks of the replicated step inputs; `inputs`: the static input buffers
  a step writes;
- `routes`: which captured graph serves a batch; `strategy`: the `auto` strategy's timed choice;
- `faults`: bounded waits, fault reports and the step watchdog; `agreement`: the debug check that
  every rank runs the same step; `divergence`: the default in-graph check of the same (step
  digests judged inside the captured step); `rendezvous`: a bounded meeting of the ranks before
  capture.
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "engine": ("DTYPES", "Engine", "SAMPLER_CONTRACT"),
})
