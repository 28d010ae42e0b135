"""The engine: what a decode loop holds, and what a step checks and runs around its graphs.

- `engine`: `Engine` (static buffers, per-slot state, capture and `step()`);
- `validate`: host-side checks of the replicated step inputs; `inputs`: the static input buffers
  a step writes;
- `routes`: which captured graph serves a batch; `strategy`: the `auto` strategy's timed choice;
- `faults`: bounded waits, fault reports and the step watchdog; `agreement`: the debug check that
  every rank runs the same step; `rendezvous`: a bounded meeting of the ranks before capture.
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# name -> module that defines it, imported on first use.
_LAZY = {
    "Engine": "graphshard.engine.engine",
    "DTYPES": "graphshard.engine.engine",
    "SAMPLER_CONTRACT": "graphshard.engine.engine",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
