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

# name -> module that defines it, imported on first use.
_LAZY = {
    "main": "graphshard.harness.cli",
    "spawn": "graphshard.harness.distributed",
    "init_from_env": "graphshard.harness.distributed",
    "Workload": "graphshard.harness.workload",
    "sample_unsharded": "graphshard.harness.oracle",
    "compare": "graphshard.harness.oracle",
    "check_graph_safe": "graphshard.harness.testing",
    "assert_replay_equals_eager": "graphshard.harness.testing",
    "GraphSafetyError": "graphshard.harness.testing",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
__all__ = sorted(_LAZY)
