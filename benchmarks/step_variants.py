"""The tp = 1 decode-loop step in variants, timed in alternating rounds on one GPU.

Usage: python3 -m benchmarks.step_variants [--modes greedy,top_k_top_p] [--batches 1,32]
       [--rounds 8] [--steps 200] [--shape 152064:float32] [--out variants.json]

V = 152064 fp32 unless `--shape` says otherwise, logits `randn * 3`, every request with the
mode's settings. The first engine has bitmask support, one graph a bucket and plain launches
(`bitmask_free_graphs = false`, `programmatic_launch = false`, whatever the defaults). No step
passes a bitmask. Each round runs
every variant's loop once (`--steps` back-to-back steps, each ending with the host read); a
variant's figure is the median over rounds of its loop medians (and the smallest), so a slow
spell of the host hits every variant alike.
- `cpu`: `Engine.step`, then `sampled_token_ids.cpu()` and `raise_if_failed()`;
- `read`: `Engine.step`, then `Engine.read()` (the step's own copy to pinned memory);
- `read_in_place`: as `read`, passing `logits=None` (the logits are already in
  `inputs.logits`) instead of the view `inputs.logits[:n]`;
- `read_in_place_<name>`: as `read_in_place`, on another engine (`OTHER_ENGINES`): `pdl`
  (`programmatic_launch = true`: the sampler's kernels and the publish launched as programmatic
  dependents), `no_bitmask_pdl` (and `grammar_bitmask = false`: one scan launch a step instead
  of two, the finish without bitmask support), and `default` (the config's defaults: bitmask
  support, programmatic launches, and `bitmask_free_graphs`, so these steps replay each bucket's
  graph without bitmask support);
- `sort_graph`: the PyTorch sort sampler captured in a graph, then `.cpu()` of its tokens.
A variant timed in an earlier run was dropped (BENCHMARKS.md): a fetch kernel reading the
pinned staging rows itself (no copy node; the same as `read`).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from benchmarks.sampling_modes import MODES, TorchSortSampler, make_logits
from benchmarks.timing import captured
from graphshard.config import Config
from graphshard.engine import Engine


def loop_median_us(step, steps: int) -> float:
    marks = [time.perf_counter()]
    for _ in range(steps):
        step()
        marks.append(time.perf_counter())
    return float(np.median(np.diff(marks))) * 1e6


def round_medians(loops: dict, rounds: int, steps: int, warmup: int) -> dict[str, list[float]]:
    """Each loop warmed up (`warmup` calls), then `rounds` rounds that run every loop once
    (`steps` calls): each loop's medians per round, µs. A slow spell of the host hits every
    loop alike."""
    for fn in loops.values():
        for _ in range(warmup):
            fn()
    per_round = {name: [] for name in loops}
    for _ in range(rounds):
        for name, fn in loops.items():
            torch.cuda.synchronize()
            per_round[name].append(loop_median_us(fn, steps))
    return per_round


# The engines timed in place beside the first (bitmask support, one graph a bucket, plain
# launches): name -> config changes from it. An earlier run timed `grammar_bitmask = false` with
# plain launches too (BENCHMARKS.md).
OTHER_ENGINES = {"pdl": dict(programmatic_launch=True),
                 "no_bitmask_pdl": dict(grammar_bitmask=False, programmatic_launch=True),
                 "default": dict(programmatic_launch=True, bitmask_free_graphs=True)}


def build(batches, vocab: int, dtype: torch.dtype, device, **changes) -> Engine:
    cfg = Config(vocab_size=vocab, max_num_reqs=max(batches), max_num_slots=max(batches),
                 logits_dtype=str(dtype).removeprefix("torch."), buckets=tuple(sorted(batches)),
                 graph_backend="cuda",
                 **{"programmatic_launch": False, "bitmask_free_graphs": False, **changes})
    engine = Engine(cfg, device=device)
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, MODES["greedy"])
    engine.capture()
    return engine


def measure(modes, batches, rounds: int, steps: int, device, vocab: int = 152064,
            dtype: torch.dtype = torch.float32) -> list[dict]:
    engine = build(batches, vocab, dtype, device)
    others = {name: build(batches, vocab, dtype, device, **changes)
              for name, changes in OTHER_ENGINES.items()}
    engines = (engine, *others.values())
    logits = make_logits(max(batches), engine.vocab, dtype, device)
    for e in engines:
        e.inputs.logits[:max(batches)].copy_(logits)
    rows = []
    for mode in modes:
        for slot in range(max(batches)):
            for e in engines:
                e.add_request(slot, MODES[mode], replace=True)
        for n in batches:
            idx = np.arange(n, dtype=np.int32)
            cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 100, np.int32)

            def by_cpu():
                engine.step(idx, cu, lens, engine.inputs.logits[:n]).sampled_token_ids.cpu()
                engine.raise_if_failed()

            def by_read():
                engine.step(idx, cu, lens, engine.inputs.logits[:n])
                return engine.read()

            def in_place_of(e):
                def in_place():
                    e.step(idx, cu, lens, None)
                    return e.read()
                return in_place

            base = TorchSortSampler(MODES[mode], logits[:n, :vocab])
            graph, tokens = captured(base.step)
            variants = {"cpu": by_cpu, "read": by_read, "read_in_place": in_place_of(engine),
                        **{f"read_in_place_{name}": in_place_of(e) for name, e in others.items()},
                        "sort_graph": lambda: (graph.replay(), tokens.cpu())}
            per_round = round_medians(variants, rounds, steps, warmup=20)
            # The same batch and positions every step: both ways of passing the logits, and
            # every engine, agree.
            records = variants["read_in_place"]().records
            agree = [np.array_equal(variants[name]().records, records)
                     for name in variants if name.startswith("read")]
            row = {"mode": mode, "batch": n, "vocab": vocab, "dtype": str(dtype),
                   "records_agree": bool(all(agree))}
            for name, values in per_round.items():
                row[f"{name}_us"] = float(np.median(values))
                row[f"{name}_min_us"] = float(np.min(values))
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    for e in engines:
        e.close()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="greedy,top_k_top_p")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--shape", default="152064:float32", help="vocab:dtype")
    parser.add_argument("--out", default="variants.json")
    args = parser.parse_args(argv)
    vocab, dtype = args.shape.split(":")
    rows = measure(args.modes.split(","), [int(b) for b in args.batches.split(",")], args.rounds,
                   args.steps, torch.device("cuda", 0), int(vocab), getattr(torch, dtype))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
