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

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "staging": ("Staging", "signal_done"),
    "kernel": ("fetch_and_plan", "plan"),
    "layout": ("PLAN_DOC", "PLAN_FIELDS", "PlanBuffers", "plan_shapes"),
    "reference": ("plan_ref",),
})
