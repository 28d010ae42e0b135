"""graphshard's tp = 1 step against the PyTorch sort sampler, same logits, same modes, one run.

Usage: python3 -m benchmarks.bench_sampling [--out sampling.json] [--shapes 152064:float32,...]
       [--modes greedy,top_k_top_p,...] [--batches 1,8,32,256,1024] [--iters 30]
       [--no-grammar-bitmask] [--no-programmatic-launch]

Per (shape, mode, batch), on one GPU:
  graphshard        Engine (tp = 1, CUDA graphs, logits written into engine.inputs.logits),
                    back-to-back steps each ending with the host read of sampled_token_ids
                    (`.cpu()`, as the sort sampler's loops read it): `step_us` is the median
                    time per loop iteration, `issue_us` the median return from step();
                    `step_read_us` the same loop reading every result with `engine.read()`
                    (the step's own copy to pinned memory); `step_inplace_us` that loop with
                    `step(..., logits=None)`, the call of a loop whose model writes its logits
                    into `engine.inputs.logits` (as the sort graph reads its static input);
                    `sampler_gpu_us` is the sampler alone (CUDA events around a graph of 10
                    calls, median per call); `slow_paths` counts the rows that were not settled
                    from their candidates during the timed calls.
  torch_sort_eager  TorchSortSampler run eagerly, the same loop with the host read.
  torch_sort_graph  the same sampler captured in one CUDA graph, replayed in the loop.
The engine's config has `grammar_bitmask = true` (as by default) unless `--no-grammar-bitmask`
(its graphshard rows then say `"grammar_bitmask": false`; no step passes a bitmask; rows say
`"bitmask_free_graphs"`: whether those steps replayed a graph without bitmask support), and
`programmatic_launch` as by default unless `--no-programmatic-launch` (rows:
`"programmatic_launch"`, what the engine applied; the sampler-alone call is launched the same
way). So by default the engine is the one a user's default config builds.
Writes a list of rows (keys mode, batch, vocab, dtype, path, step_us, ...) to --out and prints
a table. `--compile-only` times nothing: it compiles what the timing needs (the engine's capture
and the sampler-alone calls) into Triton's cache, so that a run beside other work on a fresh
machine leaves a later timed run seconds of capture instead of minutes.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from benchmarks.sampling_modes import (BATCHES, MAX_LOGPROBS, MODES, SHAPES, TorchSortSampler,
                                       make_logits, sampler_call)
from benchmarks.timing import captured, graph_of, replay_us
from graphshard.config import Config
from graphshard.engine import Engine

# Iterations of the step loops at batch <= 32, where a step costs tens of µs: the medians of a
# few dozen moved by ~10 µs between runs.
SMALL_BATCH_ITERS = 300


def loop_us(step, iters: int, warmup: int = 5) -> dict:
    """Back-to-back iterations of `step` (which ends with a host read): median and p90 per
    iteration, and the median time `step` reported as its issue time (if it returns one)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    marks, issues = [time.perf_counter()], []
    for _ in range(iters):
        issue = step()
        marks.append(time.perf_counter())
        if issue is not None:
            issues.append(issue)
    per = np.diff(marks) * 1e6
    return {"step_us": float(np.median(per)), "step_p90_us": float(np.percentile(per, 90)),
            "issue_us": float(np.median(issues)) * 1e6 if issues else None}


def sampler_alone(logits, batch, vocab, params, device, pdl: bool = False) -> tuple[float, dict]:
    """GPU µs per sampler call (graph of 10 calls, events) and the rows that took the slower
    paths during the timed calls (`SamplerWorkspace.paths`)."""
    call, ws = sampler_call(logits, vocab, params, MAX_LOGPROBS, device, pdl=pdl)
    graph = graph_of(call, 10)
    before = ws.paths()
    stats = replay_us(graph, 10, trials=10)
    after = ws.paths()
    return stats["median_us"], {k: after[k] - before[k] for k in after}


def run_shape(vocab: int, dtype: torch.dtype, modes, batches, iters: int, device,
              save=lambda rows: None, compile_only: bool = False,
              grammar_bitmask: bool = True,
              programmatic_launch: bool = Config.programmatic_launch) -> list[dict]:
    """Every (mode, batch) point of one shape; `save(rows)` after each (a call cut short keeps
    what it measured). `compile_only`: capture, launch each batch's sampler-alone call once,
    time nothing."""
    max_batch = max(batches)
    cfg = Config(vocab_size=vocab, max_num_reqs=max_batch, max_num_slots=max_batch,
                 logits_dtype=str(dtype).removeprefix("torch."), buckets=tuple(sorted(batches)),
                 graph_backend="cuda", num_logprobs=MAX_LOGPROBS, grammar_bitmask=grammar_bitmask,
                 programmatic_launch=programmatic_launch)
    engine = Engine(cfg, device=device)
    for slot in range(max_batch):
        engine.add_request(slot, MODES["greedy"])
    # On a fresh machine the capture compiles every sampler variant first: minutes, not seconds.
    start = time.perf_counter()
    print(f"{vocab} {cfg.logits_dtype}: capturing buckets {cfg.buckets}", flush=True)
    engine.capture()
    print(f"{vocab} {cfg.logits_dtype}: captured in {time.perf_counter() - start:.0f} s", flush=True)
    logits = make_logits(max_batch, engine.vocab, dtype, device)
    engine.inputs.logits[:max_batch].copy_(logits)
    rows = []
    if compile_only:
        for batch in batches:
            sampler_call(engine.inputs.logits[:batch], vocab, MODES["greedy"], MAX_LOGPROBS,
                         device, pdl=engine.programmatic_launch)[0]()
        torch.cuda.synchronize()
        engine.close()
        return rows
    for mode in modes:
        params = MODES[mode]
        for slot in range(max_batch):
            engine.add_request(slot, params, replace=True)
        for batch in batches:
            idx = np.arange(batch, dtype=np.int32)
            cu = np.arange(batch + 1, dtype=np.int32)
            lens = np.full(batch, 100, dtype=np.int32)
            view = engine.inputs.logits[:batch]

            def gs_step():
                t0 = time.perf_counter()
                out = engine.step(idx, cu, lens, view)
                t1 = time.perf_counter()
                out.sampled_token_ids.cpu()
                engine.raise_if_failed()
                return t1 - t0

            def gs_read():
                engine.step(idx, cu, lens, view)
                engine.read()

            def gs_inplace():
                engine.step(idx, cu, lens, None)
                engine.read()

            common = dict(mode=mode, batch=batch, vocab=vocab, dtype=cfg.logits_dtype)
            gpu_us, slow_paths = sampler_alone(view, batch, vocab, params, device,
                                               engine.programmatic_launch)
            n_iters = iters if batch > 32 else max(iters, SMALL_BATCH_ITERS)
            read = loop_us(gs_read, n_iters)
            inplace = loop_us(gs_inplace, n_iters)
            rows.append(dict(common, path="graphshard", grammar_bitmask=grammar_bitmask,
                             bitmask_free_graphs=engine.bitmask_free_graphs,
                             programmatic_launch=engine.programmatic_launch,
                             sampler_gpu_us=gpu_us,
                             slow_paths=slow_paths, step_read_us=read["step_us"],
                             step_read_p90_us=read["step_p90_us"],
                             step_inplace_us=inplace["step_us"],
                             step_inplace_p90_us=inplace["step_p90_us"],
                             **loop_us(gs_step, n_iters)))
            base = TorchSortSampler(params, logits[:batch, :vocab])
            rows.append(dict(common, path="torch_sort_eager",
                             **loop_us(lambda: _read(base.step()), n_iters)))
            graph, tokens = captured(base.step)
            rows.append(dict(common, path="torch_sort_graph",
                             **loop_us(lambda: _read(graph.replay(), tokens), n_iters)))
            print(_line(rows[-3:]), flush=True)
            save(rows)
    engine.close()
    return rows


def _read(*tensors) -> None:
    """The host read that ends a decode-loop iteration (None entries are skipped)."""
    for t in tensors:
        if t is not None:
            t.cpu()


def _line(rows: list[dict]) -> str:
    r = rows[0]
    cells = " ".join(f"{x['path']}={x['step_us']:.0f}" for x in rows)
    if "step_read_us" in r:
        cells += f" graphshard_read={r['step_read_us']:.0f}"
    if "step_inplace_us" in r:
        cells += f" graphshard_inplace={r['step_inplace_us']:.0f}"
    gpu = f" sampler_gpu={r['sampler_gpu_us']:.1f} slow_paths={r['slow_paths']}" \
        if "sampler_gpu_us" in r else ""
    return f"{r['vocab']} {r['dtype']} {r['mode']:>24} b={r['batch']:<5} {cells}{gpu}"


def table(rows: list[dict]) -> str:
    """Markdown: one line per (shape, mode, batch) with the three paths and the ratios."""
    cells = {}
    for r in rows:
        cells.setdefault((r["vocab"], r["dtype"], r["mode"], r["batch"]), {})[r["path"]] = r
    out = ["| vocab | dtype | mode | batch | graphshard step µs | with read() | in place + read() "
           "| sampler GPU µs | sort eager µs | sort graph µs | vs eager | vs graph | "
           "read() vs graph | in place vs graph |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
           "---: | ---: |"]
    for (vocab, dtype, mode, batch), c in cells.items():
        g, e, h = c["graphshard"], c["torch_sort_eager"], c["torch_sort_graph"]
        # Absent from files written before read() and the in-place loop existed.
        read, inplace = _against(g, "step_read_us", h), _against(g, "step_inplace_us", h)
        out.append(f"| {vocab} | {dtype} | {mode} | {batch} | {g['step_us']:.0f} | "
                   f"{read[0]} | {inplace[0]} | {g['sampler_gpu_us']:.1f} | {e['step_us']:.0f} | "
                   f"{h['step_us']:.0f} | {e['step_us'] / g['step_us']:.1f}x | "
                   f"{h['step_us'] / g['step_us']:.1f}x | {read[1]} | {inplace[1]} |")
    return "\n".join(out)


def _against(row: dict, key: str, graph: dict) -> tuple[str, str]:
    """(µs, the sort graph's µs over it) of one graphshard loop, or blanks where not measured."""
    us = row.get(key)
    return (f"{us:.0f}", f"{graph['step_us'] / us:.1f}x") if us else ("", "")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="sampling.json")
    parser.add_argument("--shapes", default=",".join(f"{v}:{str(d).removeprefix('torch.')}"
                                                     for v, d in SHAPES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--compile-only", action="store_true",
                        help="compile what the timing needs into Triton's cache; time nothing")
    parser.add_argument("--no-grammar-bitmask", action="store_true",
                        help="an engine whose config has grammar_bitmask = false")
    parser.add_argument("--programmatic-launch", action=argparse.BooleanOptionalAction,
                        default=Config.programmatic_launch,
                        help="the engine config's programmatic_launch (default: the config's "
                             "default)")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0)
    rows = []

    def save(more: list[dict]) -> None:
        with open(args.out, "w") as f:
            json.dump(rows + more, f, indent=1)

    for spec in args.shapes.split(","):
        vocab, dtype = spec.split(":")
        rows += run_shape(int(vocab), getattr(torch, dtype), args.modes.split(","),
                          [int(b) for b in args.batches.split(",")], args.iters, device, save,
                          args.compile_only, not args.no_grammar_bitmask,
                          args.programmatic_launch)
        torch.cuda.empty_cache()
    if args.compile_only:
        return
    save([])
    print(table(rows))


if __name__ == "__main__":
    main()
