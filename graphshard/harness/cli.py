"""Command line: `python -m graphshard demo|plan|bench --config configs/NAME.toml`."""

from __future__ import annotations

import argparse
import tomllib

import numpy as np

from graphshard.config import Config


def sample_batch(cfg: Config, num_reqs: int, seed: int):
    """A replicated batch as a scheduler would produce it: unique slots, 1..M rows per request."""
    rng = np.random.default_rng(seed)
    idx = rng.choice(cfg.max_num_slots, size=num_reqs, replace=False).astype(np.int32)
    counts = rng.integers(1, cfg.max_num_logits_per_req + 1, size=num_reqs)
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    seq_lens = rng.integers(1, 4096, size=num_reqs).astype(np.int32)
    return idx, cu, seq_lens


def print_plan(cfg: Config, tp_size: int, num_reqs: int, seed: int) -> None:
    import torch

    from graphshard.plan.kernel import plan
    from graphshard.plan.layout import PLAN_DOC, PlanBuffers
    from graphshard.engine.validate import BatchLimits, validate_batch

    idx, cu, lens = sample_batch(cfg, num_reqs, seed)
    limits = BatchLimits(cfg.max_num_reqs, cfg.max_num_logits_per_req, cfg.max_num_slots)
    idx, cu, lens = validate_batch(idx, cu, lens, limits)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def padded(a, length):
        t = torch.zeros(length, dtype=torch.int32)
        t[: a.shape[0]] = torch.from_numpy(a)
        return t.to(device)

    print(f"batch: n={num_reqs} slots={idx.tolist()} cu_num_logits={cu.tolist()}")
    for rank in range(tp_size):
        buf = PlanBuffers.allocate(cfg.max_num_reqs, cfg.max_num_logits_per_req, tp_size, device)
        plan(buf, idx_mapping=padded(idx, cfg.max_num_reqs), cu_num_logits=padded(cu, cfg.max_num_reqs + 1),
             seq_lens=padded(lens, cfg.max_num_reqs),
             num_reqs=torch.tensor([num_reqs], dtype=torch.int32, device=device),
             tp_rank=rank, gather_stride=cfg.max_num_reqs,
             max_num_logits_per_req=cfg.max_num_logits_per_req)
        print(f"\n-- rank {rank} of {tp_size} --")
        rows = int(buf.owner_row_offsets[-1])
        local_reqs, local_rows = int(buf.local_num_reqs[0]), int(buf.local_num_rows[0])
        live = {"send_rows": rows, "gathered_src_indices": num_reqs, "local_req_indices": local_reqs,
                "local_idx_mapping": local_reqs, "local_cu_num_logits": local_reqs + 1,
                "local_seq_lens": local_reqs, "local_row_src": local_rows, "local_row_slot": local_rows,
                "local_row_pos": local_rows, "local_draft_tokens": local_rows}
        for name, t in buf.as_dict().items():
            values = t[: live.get(name, t.shape[0])].tolist()
            print(f"  {name:22s} {str(values):40s}  {PLAN_DOC[name]}")


def run_demo(cfg: Config, demo: dict, args) -> int:
    from graphshard.harness.demo import DemoSettings, report, run

    tp = args.tp or demo.get("tp", 2)
    settings = DemoSettings(steps=args.steps or demo.get("steps", 100),
                            seed=args.seed if args.seed is not None else demo.get("seed", 0),
                            capture=not args.no_capture)
    results = run(cfg, tp, settings)
    print(report(results, cfg))
    return 0


def bench_settings(cfg: Config, args):
    """The sweep's settings from the command line (subsets of batches, vocabularies, dtypes,
    paths; step counts)."""
    from graphshard.harness.bench import SweepSettings
    from graphshard.harness.bench_report import PATHS

    def listed(text, kind=str):
        return tuple(kind(v) for v in text.split(",") if v)

    changes = {"base": cfg}
    for field, kind in (("batches", int), ("vocabs", int), ("dtypes", str), ("paths", str)):
        value = getattr(args, field)
        if value:
            changes[field] = listed(value, kind)
    unknown = sorted(set(changes.get("paths", ())) - set(PATHS))
    if unknown:
        raise SystemExit(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    for field in ("iters", "warmup", "aligned_iters"):
        if getattr(args, field) is not None:
            changes[field] = getattr(args, field)
    return SweepSettings(**changes)


def run_bench(cfg: Config, args) -> int:
    from pathlib import Path

    from graphshard.harness.bench import run

    run(bench_settings(cfg, args), Path(args.out), tp=args.tp)
    return 0


def add_bench_arguments(bench_p: argparse.ArgumentParser) -> None:
    bench_p.add_argument("--config", required=True, help="a TOML preset (the sweep sets its own shapes)")
    bench_p.add_argument("--tp", type=int, default=None, help="number of GPUs (default: all)")
    bench_p.add_argument("--out", default="out/sweep", help="folder for loop.json, auto.json, loop.md")
    bench_p.add_argument("--batches", default=None, help="comma-separated batch sizes")
    bench_p.add_argument("--vocabs", default=None, help="comma-separated vocabulary sizes")
    bench_p.add_argument("--dtypes", default=None, help="comma-separated logits dtypes")
    bench_p.add_argument("--paths", default=None, help="comma-separated paths (default: all)")
    bench_p.add_argument("--iters", type=int, default=None, help="back-to-back steps timed per point")
    bench_p.add_argument("--warmup", type=int, default=None, help="untimed steps before them")
    bench_p.add_argument("--aligned-iters", type=int, default=None,
                         help="barrier-aligned steps per point (0: skip that column)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphshard")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_p = sub.add_parser("demo", help="run a simulated decode loop, every step checked against the oracle")
    plan_p = sub.add_parser("plan", help="print the plan of a sample batch on every rank")
    for p in (demo_p, plan_p):
        p.add_argument("--config", required=True, help="a TOML preset from configs/")
        p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: the preset's)")
        p.add_argument("--seed", type=int, default=None)
    demo_p.add_argument("--steps", type=int, default=None)
    demo_p.add_argument("--no-capture", action="store_true", help="run every step eagerly")
    plan_p.add_argument("--num-reqs", type=int, default=None)
    bench_p = sub.add_parser("bench", help="time the decode loop of every step implementation on the GPUs")
    add_bench_arguments(bench_p)
    return parser


def main(argv=None) -> int:
    # Importing graphshard (this package) already chose Triton's interpreter where there is no CUDA.
    args = build_parser().parse_args(argv)
    cfg = Config.from_toml(args.config)
    with open(args.config, "rb") as f:
        demo = tomllib.load(f).get("demo", {})
    if args.command == "demo":
        return run_demo(cfg, demo, args)
    if args.command == "bench":
        return run_bench(cfg, args)
    tp = args.tp or demo.get("tp", 2)
    seed = args.seed if args.seed is not None else demo.get("seed", 0)
    num_reqs = args.num_reqs if args.num_reqs is not None else min(8, cfg.max_num_reqs)
    print_plan(cfg, tp, num_reqs, seed)
    return 0
