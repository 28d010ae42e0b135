"""Where a step of the mixed GPU workload spends its time, at tp = 1 on one GPU.

Usage: python3 -m benchmarks.mixed_steps [--steps 300] [--seed 11] [--profile-steps 100]
       [--parts] [--verify] [--launch-cost ROUNDS] [--out mixed.json]
       python3 -m benchmarks.mixed_steps --compare BASE.json[.gz] OTHER.json[.gz]

The workload and config are those of `tests/gpu/test_engine_gpu.py::test_mixed_workload_equals_oracle`
(V = 32000 bf16, up to 96 requests of up to 3 rows, buckets up to 64, mixed sampling parameters,
drafts, grammar bitmasks, logprobs, NaN rows), timed as the test and the demo time a step: the
device idle before it, then `step()` and `read()`. With `--verify` every timed step is then
checked against the unsharded oracle, as the test checks it.

Per step it records the batch (requests, rows, bitmask, graph or eager), the host's issue time,
the whole step, and the rows that left the sampler's candidate path (`SamplerWorkspace.paths`,
read after the step is timed). It prints the step p50 by kind of step and by slow path, then, for
`--profile-steps` more steps under torch.profiler, each kernel's device µs per step (CUPTI).

`--compare` (no GPU needed) pairs two runs' timed steps, which are the same batches for the same
seed and step count, and prints the median of the per-step differences (OTHER - BASE) of the
step, its issue time and each host part: a host's drift between two runs moves every part, a
change moves its own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.engine.routes import eager_keys
from graphshard.harness.demo import VerificationError, device_inputs, oracle_mismatch
from graphshard.harness.workload import Workload
from graphshard.runtime.launch import bound, launch
from graphshard.sample.params import SlotTables
from graphshard.sample.records import HostOutput
from graphshard.sample.workspace import STAT_NAMES

STAT_PATHS = tuple(STAT_NAMES)  # the slow paths `SamplerWorkspace.paths` counts

MIXED = Config(vocab_size=32000, max_num_reqs=96, max_num_logits_per_req=3, max_num_slots=192,
               logits_dtype="bfloat16", graph_backend="cuda", num_logprobs=3,
               buckets=(1, 2, 4, 8, 16, 24, 32, 48, 64))


def _inputs(workload: Workload, engine: Engine, tables: SlotTables | None = None):
    """The next batch, its churn applied to the engine (and to the oracle's `tables`), and its
    device tensors."""
    batch = workload.next_batch()
    for slot in batch.removed:
        engine.remove_request(slot)
    for slot, params in batch.added:
        engine.add_request(slot, params)
        if tables is not None:
            tables.set(slot, params)
    logits = workload.logits(batch, engine.vocab, engine.dtype, engine.device)
    return (batch, logits, *device_inputs(batch, engine.device))


# The host parts of `Engine.step` timed with `--parts` (owner, method): what a step's issue time is
# made of. Wrapping adds ~0.1 µs a call.
PARTS = (("engine", "_check_step"), ("engine", "_check_step_exactly"), ("checker", "accepts"),
         ("inputs", "tensors_fit"), ("engine", "_admit"), ("inputs", "stage"),
         ("inputs", "write_tensors"), ("engine", "_run"), ("engine", "_run_eager"),
         ("parts", "step_fn"), ("engine", "_settle"), ("inputs", "fetch"),
         ("host_records", "publish"))


def wrap_parts(engine: Engine) -> dict[str, float]:
    """Time each part of PARTS into the returned dict (µs, summed since the caller cleared it)."""
    spent: dict[str, float] = defaultdict(float)
    owners = {"engine": engine, "checker": engine.checker, "inputs": engine.inputs,
              "parts": engine.parts, "host_records": engine.parts.host_records}

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += (time.perf_counter() - t) * 1e6
        return wrapper

    for owner, method in PARTS:
        obj = owners[owner]
        if obj is None:  # no host records past tp = 1
            continue
        # object.__setattr__: the step parts are a frozen dataclass.
        object.__setattr__(obj, method, timed(f"{owner}.{method}", getattr(obj, method)))
    return spent


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step(engine: Engine, batch, logits, drafts, bitmask) -> tuple[float, float, HostOutput]:
    """(issue µs, step µs, the step's results) of one step started with the device idle."""
    _sync(engine.device)
    t0 = time.perf_counter()
    engine.step(batch.idx_mapping, batch.cu_num_logits, batch.seq_lens, logits,
                draft_token_ids=drafts, grammar_bitmask=bitmask)
    t1 = time.perf_counter()
    host = engine.read()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6, (t2 - t0) * 1e6, host


def run(steps: int, seed: int, profile_steps: int = 0, parts: bool = False,
        verify: bool = False, cfg: Config = MIXED, launch_rounds: int = 0) -> dict:
    """Time `steps` steps of `cfg`'s mixed workload (then profile `profile_steps` more on a
    GPU, then `launch_cost` over `launch_rounds`); `parts` and `verify` as the command's
    options. Other configs than MIXED are for tests."""
    engine = Engine(cfg)
    t = time.perf_counter()
    engine.capture()
    capture_s = time.perf_counter() - t
    spent = wrap_parts(engine) if parts else {}
    workload = Workload(cfg, seed)
    tables = SlotTables(cfg.max_num_slots, engine.device) if verify else None
    rows = []
    for i in range(steps):
        batch, logits, drafts, bitmask = _inputs(workload, engine, tables)
        before = engine.workspace.paths()
        spent.clear()
        issue_us, step_us, host = _step(engine, batch, logits, drafts, bitmask)
        host_parts = dict(spent)
        after = engine.workspace.paths()
        if verify:  # as the GPU test checks its steps (tp = 1: the logits are the full rows)
            why = oracle_mismatch(engine, batch, logits, drafts, bitmask, host, tables)
            if why is not None:
                raise VerificationError(f"step {i} (n={batch.num_reqs}): {why}")
        rows.append(dict(step=i, n=batch.num_reqs, rows=batch.num_logits,
                         bitmask=bitmask is not None, eager=batch.num_reqs > cfg.max_bucket,
                         issue_us=issue_us, step_us=step_us, parts=host_parts,
                         paths={k: after[k] - before[k] for k in after if after[k] != before[k]}))
    device = (torch.cuda.get_device_name(engine.device) if engine.device.type == "cuda"
              else "cpu")
    print(summary(dict(device=device, capture_s=capture_s, steps=rows, kernels_us_per_step={},
                       verified=steps if verify else 0)), flush=True)
    kernels: dict[str, float] = defaultdict(float)
    if profile_steps and engine.device.type == "cuda":
        # The batches' churn must reach the engine step by step, so their logits are made
        # inside the profile too (their kernels are named apart from the step's).
        _sync(engine.device)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profile_steps):
                _step(engine, *_inputs(workload, engine))
            _sync(engine.device)
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] += e.device_time / profile_steps
    launches = launch_cost(engine, launch_rounds) if launch_rounds else {}
    engine.close()
    return dict(device=device, capture_s=capture_s, verified=steps if verify else 0, steps=rows,
                kernels_us_per_step=dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
                launch_us=launches)


def launch_cost(engine: Engine, rounds: int) -> dict[str, list[float]]:
    """Host µs (median of `rounds`) of each launch of an eager step's sampler call at
    max_num_reqs, as `launch` makes it and as a `bound` launch repeats it, by kernel. Each round
    issues the call's launches in order (plain and bound rounds alternate), the device idle
    before it, as an eager step issues them."""
    strategy = engine._strategy[engine.config.max_bucket]
    key = eager_keys(engine.config.max_bucket, engine.config.max_num_reqs, (strategy,),
                     engine.tp_size)[-1]
    items = engine.parts.sampler_launches([key])
    thunks = [bound(item) for item in items]
    for thunk in thunks:  # their first calls take the full path
        thunk()
    names = [getattr(item.kernel, "__name__", str(item.kernel)) for item in items]
    spent = {kind: [[] for _ in items] for kind in ("plain", "bound")}
    for _ in range(rounds):
        for kind in ("plain", "bound"):
            _sync(engine.device)
            for i, item in enumerate(items):
                t = time.perf_counter()
                if kind == "plain":
                    launch(item.kernel, item.grid, *item.args, **item.kwargs)
                else:
                    thunks[i]()
                spent[kind][i].append((time.perf_counter() - t) * 1e6)
    _sync(engine.device)
    return {f"{i} {name}": [float(np.median(spent["plain"][i])), float(np.median(spent["bound"][i]))]
            for i, name in enumerate(names)}


def _p50(values) -> str:
    return f"{np.median(values):7.0f}" if values else "      -"


def warm_up(steps: list) -> int:
    """The first steps the summary leaves out (their first replays)."""
    return len(steps) // 10


def summary(result: dict) -> str:
    rows = result["steps"][warm_up(result["steps"]):]
    groups = {
        "all": rows,
        "graph": [r for r in rows if not r["eager"]],
        "eager": [r for r in rows if r["eager"]],
        "graph, no slow path": [r for r in rows if not r["eager"] and not r["paths"]],
        "graph, a slow path": [r for r in rows if not r["eager"] and r["paths"]],
        "graph, bitmask": [r for r in rows if not r["eager"] and r["bitmask"]],
        "graph, no bitmask": [r for r in rows if not r["eager"] and not r["bitmask"]],
    }
    for name in STAT_PATHS:
        groups[f"graph, {name}"] = [r for r in rows if not r["eager"] and name in r["paths"]]
    lines = [f"{result['device']}; capture {result['capture_s']:.1f} s; {len(rows)} steps timed; "
             f"{result.get('verified', 0)} steps equal to the oracle",
             f"{'steps':24} {'count':>5} {'issue p50':>9} {'step p50':>8} {'step p90':>8}"]
    for name, g in groups.items():
        p90 = f"{np.percentile([r['step_us'] for r in g], 90):8.0f}" if g else "       -"
        lines.append(f"{name:24} {len(g):5d} {_p50([r['issue_us'] for r in g]):>9} "
                     f"{_p50([r['step_us'] for r in g]):>8} {p90}")
    names = sorted({name for r in rows for name in r.get("parts", {})})
    if names:
        lines.append("host µs per step of each part of step() (p50 over the steps that called it):")
        for name in names:
            line = f"  {name:28}"
            for kind, g in (("graph", groups["graph"]), ("eager", groups["eager"])):
                v = [r["parts"][name] for r in g if name in r["parts"]]
                line += f"  {kind} {len(v):4d} x {np.median(v) if v else 0.0:7.1f}"
            lines.append(line)
    if result.get("launch_us"):
        lines.append("host µs per launch of an eager step's sampler call (p50): plain, bound")
        for name, (plain, fast) in result["launch_us"].items():
            lines.append(f"  {plain:7.1f} {fast:7.1f}  {name}")
    lines.append("kernel device µs per step (profiled steps):")
    for name, us in list(result["kernels_us_per_step"].items())[:25]:
        lines.append(f"  {us:9.1f}  {name[:100]}")
    return "\n".join(lines)


def load(path: str) -> dict:
    """A result written by `--out`, gzipped or not."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f)


def paired(base: dict, other: dict) -> dict[str, tuple[int, float]]:
    """Per quantity (step, issue, each host part): over the timed steps where both runs have it,
    (how many, the median of OTHER - BASE in µs). Raises where the runs' batches differ."""
    a, b = base["steps"], other["steps"]
    if [(s["n"], s["rows"], s["eager"]) for s in a] != [(s["n"], s["rows"], s["eager"]) for s in b]:
        raise ValueError("the two runs did not step the same batches (seed or step count differ)")
    diffs = defaultdict(list)
    for s, t in list(zip(a, b))[warm_up(a):]:
        diffs["step"].append(t["step_us"] - s["step_us"])
        diffs["issue"].append(t["issue_us"] - s["issue_us"])
        for name in s.get("parts", {}).keys() & t.get("parts", {}).keys():
            diffs[name].append(t["parts"][name] - s["parts"][name])
    return {name: (len(d), float(np.median(d))) for name, d in sorted(diffs.items())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--profile-steps", type=int, default=100)
    ap.add_argument("--parts", action="store_true",
                    help="time the host parts of step() (PARTS) in every timed step")
    ap.add_argument("--verify", action="store_true",
                    help="check every timed step against the unsharded oracle (after its timing)")
    ap.add_argument("--launch-cost", type=int, default=0, metavar="ROUNDS",
                    help="then time each launch of an eager step's sampler call, plain and bound")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, metavar=("BASE", "OTHER"),
                    help="print the paired per-step differences of two --out files, then exit")
    args = ap.parse_args(argv)
    if args.compare:
        base, other = map(load, args.compare)
        print(f"median of per-step differences, {args.compare[1]} - {args.compare[0]} (µs):")
        for name, (count, median) in paired(base, other).items():
            print(f"  {name:28} {count:4d} x {median:+8.1f}")
        return
    if not torch.cuda.is_available():
        raise SystemExit("mixed_steps needs a CUDA GPU")
    result = run(args.steps, args.seed, args.profile_steps, args.parts, args.verify,
                 launch_rounds=args.launch_cost)
    text = summary(result)  # its steps were printed as they ended: what came after them
    start = text.find("host µs per launch")
    print(text[start if start >= 0 else text.index("kernel device"):])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
