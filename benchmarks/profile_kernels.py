"""GPU time per kernel: the sampler's two launches per mode and batch, and every kernel of a
captured tp = 1 engine step (CUPTI through torch.profiler; no hardware counters needed).

Usage: python3 -m benchmarks.profile_kernels [--vocab 152064] [--dtype float32]
       [--modes greedy,top_k_top_p,...] [--batches 1,32,256,1024] [--k K] [--bitmask]
       [--no-step] [--splits-per-program N] [--chunk-size C] [--out kernels.json]
Prints one line per (what, batch, kernel): mean µs per call over the profiled calls, and per
(mode, batch) the rows that left the sampler's candidate path over those calls.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.sampling_modes import MAX_LOGPROBS, MODES, make_logits, sampler_call
from graphshard.config import Config
from graphshard.engine import Engine

CALLS = 20


def device_events(fn, calls: int, warmup: int = 2) -> list:
    """The device operations (CUPTI, torch.profiler events) of `calls` calls of `fn`, after
    `warmup` calls outside the profile."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def kernel_us(fn, calls: int = CALLS) -> dict[str, float]:
    """Mean device µs per call of each kernel `fn` launches (after two warm-up calls)."""
    total = defaultdict(float)
    for event in device_events(fn, calls):
        total[event.name] += event.device_time
    return {name: t / calls for name, t in sorted(total.items(), key=lambda kv: -kv[1])}


def step_kernels(vocab, dtype, batches, device) -> list[dict]:
    """Every kernel of a captured greedy tp = 1 step (no logprobs in the config)."""
    cfg = Config(vocab_size=vocab, max_num_reqs=max(batches), max_num_slots=max(batches),
                 logits_dtype=str(dtype).removeprefix("torch."), buckets=tuple(batches),
                 graph_backend="cuda", num_logprobs=0)
    engine = Engine(cfg, device=device)
    for slot in range(max(batches)):
        engine.add_request(slot, MODES["greedy"])
    engine.capture()
    engine.inputs.logits[:max(batches)].copy_(make_logits(max(batches), engine.vocab, dtype,
                                                          device))
    rows = []
    for batch in batches:
        idx, cu = np.arange(batch, dtype=np.int32), np.arange(batch + 1, dtype=np.int32)
        lens = np.full(batch, 100, np.int32)
        view = engine.inputs.logits[:batch]
        for name, us in kernel_us(lambda: engine.step(idx, cu, lens, view)).items():
            rows.append(dict(what="tp1_step_greedy", batch=batch, kernel=name, us=us))
    engine.close()
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    """The run's arguments, checked (no GPU needed); `batches` parsed into a list of ints.
    `benchmarks.prebuild` takes the same ones."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--modes", default="greedy,top_k,top_p,top_k_top_p,min_p,logprobs_20")
    parser.add_argument("--batches", default="1,32,256,1024")
    parser.add_argument("--k", type=int, default=None,
                        help="layout K of every mode (default: 20 for logprob modes, else 0)")
    parser.add_argument("--bitmask", action="store_true",
                        help="sampler calls with a grammar bitmask switched on by its device flag")
    parser.add_argument("--pdl", action="store_true",
                        help="sampler kernels launched as programmatic dependents")
    parser.add_argument("--no-step", action="store_true", help="skip the tp = 1 engine step")
    parser.add_argument("--splits-per-program", type=int, default=None,
                        help="vocabulary chunks per scan program (default: the sampler's choice)")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="vocabulary columns per scan chunk (default: the workspace's choice)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--check", action="store_true",
                        help="check the arguments and exit (no GPU needed): a device call's "
                             "script can refuse a typo before it spends the call")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {sorted(MODES)}")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches must be integers separated by commas, got {args.batches!r}")
    return args


def sampler_calls(args: argparse.Namespace, device):
    """(what, batch, call, workspace) of every (mode, batch) the arguments name, in order."""
    logits = make_logits(max(args.batches), args.vocab, getattr(torch, args.dtype), device)
    for mode in args.modes.split(","):
        for batch in args.batches:
            k = args.k if args.k is not None else MAX_LOGPROBS if MODES[mode].num_logprobs else 0
            call, ws = sampler_call(logits[:batch], args.vocab, MODES[mode], k, device,
                                    bitmask=args.bitmask,
                                    splits_per_program=args.splits_per_program, pdl=args.pdl,
                                    chunk_size=args.chunk_size)
            what = f"sampler_{mode}" + ("_bitmask" if args.bitmask else "") + \
                ("_pdl" if args.pdl else "") + \
                (f"_chunk{args.chunk_size}" if args.chunk_size else "")
            yield what, batch, call, ws


def compile_ahead(calls, workers: int | None = None) -> int:
    """Compile every kernel variant `calls` launch at once, on `workers` threads (default: all
    cores), before any is timed; returns how many were not in memory. An ablation's older tree
    (`benchmarks/ablations/trees.sh` copies this script into it) may predate
    `deferred_launches`: there each variant compiles at its first launch (returns 0)."""
    try:
        from graphshard.runtime.launch import compile_launches, deferred_launches
    except ImportError:
        return 0
    with deferred_launches() as launches:
        for call in calls:
            call()
    return compile_launches(launches, workers)


def main(argv=None):
    args = parse_args(argv)
    if args.check:
        return
    device = torch.device("cuda")
    rows = []
    calls = list(sampler_calls(args, device))
    compile_ahead(call for _, _, call, _ in calls)
    for what, batch, call, ws in calls:
        for name, us in kernel_us(call).items():
            rows.append(dict(what=what, batch=batch, kernel=name, us=us))
        # Rows of all the calls above that left the candidate path (see SamplerWorkspace).
        rows.append(dict(what=what, batch=batch, kernel="paths", us=0.0, paths=ws.paths()))
    if not args.no_step:
        rows += step_kernels(args.vocab, getattr(torch, args.dtype), args.batches, device)
    for r in rows:
        if r["kernel"] == "paths":
            print(f"{r['what']:>24s} b={r['batch']:<5d} paths {r['paths']}")
        else:
            print(f"{r['what']:>24s} b={r['batch']:<5d} {r['us']:9.1f} us  {r['kernel'][:60]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
