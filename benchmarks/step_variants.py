"""The tp = 1 decode-loop step in variants, timed in alternating rounds on one GPU.

Usage: python3 -m benchmarks.step_variants [--modes greedy,top_k_top_p] [--batches 1,32]
       [--rounds 8] [--steps 200] [--out variants.json]

V = 152064 fp32, logits `randn * 3`, every request with the mode's settings. Each round runs
every variant's loop once (`--steps` back-to-back steps, each ending with the host read); a
variant's figure is the median over rounds of its loop medians (and the smallest), so a slow
spell of the host hits every variant alike.
- `cpu`: `Engine.step`, then `sampled_token_ids.cpu()` and `raise_if_failed()`;
- `read`: `Engine.step`, then `Engine.read()` (the step's own copy to pinned memory);
- `read_one_scan`: as `read`, with an engine whose sampler is built without bitmask support
  (one scan launch per step instead of two: what a graph per bitmask presence would save);
- `sort_graph`: the PyTorch sort sampler captured in a graph, then `.cpu()` of its tokens.
A variant whose fetch kernel read the pinned staging rows itself (no copy node) timed the same
as `read` and was dropped (BENCHMARKS.md).
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
from graphshard.sample.kernels import SamplerWorkspace, sample

VOCAB = 152064


def loop_median_us(step, steps: int) -> float:
    marks = [time.perf_counter()]
    for _ in range(steps):
        step()
        marks.append(time.perf_counter())
    return float(np.median(np.diff(marks))) * 1e6


def one_scan_sampler(cfg: Config, device):
    """The built-in sampler without bitmask support, with a workspace of its own."""
    workspace = SamplerWorkspace.allocate(cfg.max_num_reqs, cfg.max_num_logits_per_req,
                                          cfg.vocab_size, device)

    def run(logits, *, bitmask=None, bitmask_rows=None, bitmask_enabled=None, **kwargs):
        sample(logits, workspace=workspace, **kwargs)

    return run


def engines(batches, device) -> dict[str, Engine]:
    cfg = Config(vocab_size=VOCAB, max_num_reqs=max(batches), max_num_slots=max(batches),
                 buckets=tuple(sorted(batches)), graph_backend="cuda")
    built = {"shipped": Engine(cfg, device=device),
             "one_scan": Engine(cfg, device=device, sampler=one_scan_sampler(cfg, device))}
    for engine in built.values():
        for slot in range(cfg.max_num_slots):
            engine.add_request(slot, MODES["greedy"])
        engine.capture()
    return built


def measure(modes, batches, rounds: int, steps: int, device) -> list[dict]:
    built = engines(batches, device)
    logits = make_logits(max(batches), built["shipped"].vocab, torch.float32, device)
    for engine in built.values():
        engine.inputs.logits[:max(batches)].copy_(logits)
    rows = []
    for mode in modes:
        for engine in built.values():
            for slot in range(max(batches)):
                engine.add_request(slot, MODES[mode], replace=True)
        for n in batches:
            idx = np.arange(n, dtype=np.int32)
            cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 100, np.int32)

            def by_cpu(engine=built["shipped"]):
                engine.step(idx, cu, lens, engine.inputs.logits[:n]).sampled_token_ids.cpu()
                engine.raise_if_failed()

            def by_read(engine):
                return lambda: (engine.step(idx, cu, lens, engine.inputs.logits[:n]),
                                engine.read())

            base = TorchSortSampler(MODES[mode], logits[:n, :VOCAB])
            graph, tokens = captured(base.step)
            variants = {"cpu": by_cpu, "read": by_read(built["shipped"]),
                        "read_one_scan": by_read(built["one_scan"]),
                        "sort_graph": lambda: (graph.replay(), tokens.cpu())}
            for fn in variants.values():
                for _ in range(20):
                    fn()
            per_round = {name: [] for name in variants}
            for _ in range(rounds):
                for name, fn in variants.items():
                    torch.cuda.synchronize()
                    per_round[name].append(loop_median_us(fn, steps))
            # The variants step the same batch: their records must agree.
            row = {"mode": mode, "batch": n, "records_agree": all(
                np.array_equal(e.read().records, built["shipped"].read().records)
                for e in built.values())}
            for name, values in per_round.items():
                row[f"{name}_us"] = float(np.median(values))
                row[f"{name}_min_us"] = float(np.min(values))
            rows.append(row)
            print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in row.items()), flush=True)
    for engine in built.values():
        engine.close()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="greedy,top_k_top_p")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="variants.json")
    args = parser.parse_args(argv)
    rows = measure(args.modes.split(","), [int(b) for b in args.batches.split(",")], args.rounds,
                   args.steps, torch.device("cuda", 0))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
