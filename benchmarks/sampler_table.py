"""Tables of `benchmarks/test_bench_sampler.py`'s pytest-benchmark JSON: per shape, the sampler's
GPU µs per call by mode and batch, and each mode over greedy at the same batch.

Usage: python3 -m benchmarks.sampler_table BENCH_JSON [--out table.md]
(BENCH_JSON from `pytest benchmarks/test_bench_sampler.py --benchmark-json=BENCH_JSON`).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def cases(report: dict) -> list[dict]:
    """The extra_info of every sampler case in a pytest-benchmark report."""
    return [b["extra_info"] for b in report.get("benchmarks", [])
            if b.get("name", "").startswith("test_sampler[") and "sampler_gpu_us" in b.get("extra_info", {})]


def tables(rows: list[dict]) -> str:
    """One markdown table per (vocab, dtype): a line per mode, µs and ratio to greedy per batch."""
    by_shape = defaultdict(dict)
    for r in rows:
        by_shape[(r["vocab"], r["dtype"])][(r["mode"], r["batch"])] = r["sampler_gpu_us"]
    out = []
    for (vocab, dtype), times in sorted(by_shape.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        batches = sorted({b for _, b in times})
        modes = list(dict.fromkeys(m for m, _ in times))
        out.append(f"V = {vocab} {dtype}, sampler GPU µs per call (× greedy at the same batch)\n")
        out.append("| mode | " + " | ".join(str(b) for b in batches) + " |")
        out.append("| --- |" + " ---: |" * len(batches))
        for mode in modes:
            cells = []
            for b in batches:
                us, greedy = times.get((mode, b)), times.get(("greedy", b))
                if us is None:
                    cells.append("")
                elif mode == "greedy" or not greedy:
                    cells.append(f"{us:.1f}")
                else:
                    cells.append(f"{us:.1f} ({us / greedy:.2f}×)")
            out.append(f"| {mode} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench_json")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    with open(args.bench_json) as f:
        text = tables(cases(json.load(f)))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
