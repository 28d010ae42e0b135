"""Plan: the step's first stage. From the replicated inputs, on the device, where every request's
rows go (owner-sorted layout, the owned sub-batch, the gather order).

- `staging`: the host stages each step's replicated inputs; the step's first kernel fetches them
  (`Staging`), its last one writes the step's number back (`signal_done`);
- `kernel`: the plan kernel and its launchers (`plan`, and `fetch_and_plan`, which fuses the fetch);
- `layout`: the plan's buffers (`PlanBuffers`), shared by the kernel and its reference;
- `reference`: the NumPy reference of the plan (`plan_ref`).
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# name -> module that defines it, imported on first use.
_LAZY = {
    "fetch_and_plan": "graphshard.plan.kernel",
    "plan": "graphshard.plan.kernel",
    "PLAN_DOC": "graphshard.plan.layout",
    "PLAN_FIELDS": "graphshard.plan.layout",
    "PlanBuffers": "graphshard.plan.layout",
    "plan_shapes": "graphshard.plan.layout",
    "plan_ref": "graphshard.plan.reference",
    "Staging": "graphshard.plan.staging",
    "signal_done": "graphshard.plan.staging",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
