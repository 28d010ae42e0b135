"""The harness around the library: what runs, checks and measures it, none of which a step uses.

- `cli`: `python -m graphshard demo|plan|bench`; `demo`: the main job, a simulated decode loop
  checked step by step against the `oracle` (an unsharded sampler); `workload`: that loop's
  requests and batches;
- `bench`, `bench_report`, `baselines`: the sweep, its reports, and what it compares against;
- `distributed`: process launching and group set-up (`spawn`, `init_from_env`);
- `testing`: graph-safety checks for a user's own step code on a CPU-only machine.
"""

from __future__ import annotations

from graphshard._lazy import lazy_exports

# module -> the public names it defines, each loaded on first use.
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "cli": ("main",),
    "distributed": ("init_from_env", "spawn"),
    "workload": ("Workload",),
    "oracle": ("compare", "sample_unsharded"),
    "testing": ("GraphSafetyError", "assert_replay_equals_eager", "check_graph_safe"),
})
