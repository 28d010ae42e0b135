"""Where a kernel's warps spend their time, from Nsight Compute's SASS page exported as CSV
(`ncu -i REPORT --page source --csv --print-source sass`): the executed stretches of code with
their share of the warp-stall samples and of the executed instructions, and the stall reasons.

Usage: python3 -m benchmarks.stall_summary FILE.sass.csv [--top 12] [--cubin KERNEL.cubin]

`--cubin` names the profiled kernel's machine code (the `.cubin` of its Triton cache entry,
which a CPU machine can read): its line table (`nvdisasm -g`) then names the source lines
that hold the most stall samples. The cubin must be the profiled one: the instruction counts
are checked.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
import subprocess
from pathlib import Path


def _num(v: str) -> float:
    return float(v.replace(",", "")) if v not in ("", "-") else 0.0


def load(path: str) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    names = rows[header]
    return names, [dict(zip(names, r)) for r in rows[header + 1:] if len(r) == len(names)]


def stretches(data: list[dict], gap: int = 4) -> list[tuple[int, int]]:
    """Index ranges of executed instructions, split where more than `gap` in a row never ran."""
    out, start, last = [], None, None
    for i, d in enumerate(data):
        if _num(d["Instructions Executed"]) > 0:
            if start is None:
                start = i
            elif i - last > gap:
                out.append((start, last))
                start = i
            last = i
    if start is not None:
        out.append((start, last))
    return out


def summary(path: str, top: int = 12) -> str:
    names, data = load(path)
    samples = [_num(d["Warp Stall Sampling (All Samples)"]) for d in data]
    executed = [_num(d["Instructions Executed"]) for d in data]
    total_s, total_i = sum(samples) or 1.0, sum(executed) or 1.0
    lines = [f"{path}: {len(data)} instructions, {total_i:.4g} warp instructions executed, "
             f"{total_s:.0f} stall samples"]
    ranked = sorted(stretches(data), key=lambda ab: -sum(samples[ab[0]:ab[1] + 1]))[:top]
    for a, b in sorted(ranked):
        s, n = sum(samples[a:b + 1]), sum(executed[a:b + 1])
        first = data[a]["Source"].strip().split(";")[0][:34]
        lines.append(f"  [{a:5d}, {b:5d}] samples {s / total_s:6.1%}  instructions "
                     f"{n / total_i:6.1%}  ({first})")
    reasons = {n: sum(_num(d[n]) for d in data) for n in names
               if n.startswith("stall_") and "Not Issued" not in n}
    lines.append("  stalls: " + ", ".join(f"{n[6:]} {v / total_s:.1%}" for n, v in
                                          sorted(reasons.items(), key=lambda kv: -kv[1])[:8]))
    return "\n".join(lines)


def source_lines(cubin: str) -> list[str]:
    """The source line ("file.py:N") of each machine instruction of `cubin`, in order."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    text = subprocess.run([str(tool), "-g", "-c", cubin], check=True, capture_output=True,
                          text=True).stdout
    where, out = "?", []
    for line in text.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = f"{Path(m.group(1)).name}:{m.group(2)}"
        elif re.match(r"\s+/\*[0-9a-f]{4,5}\*/ ", line):
            out.append(where)
    return out


def by_line(path: str, cubin: str, top: int = 12) -> str:
    """The source lines with the most stall samples, with their executed instructions."""
    _, data = load(path)
    where = source_lines(cubin)
    if len(where) != len(data):
        raise ValueError(f"{cubin} has {len(where)} instructions, the profile {len(data)}: "
                         "not the profiled kernel")
    samples, executed = collections.Counter(), collections.Counter()
    for w, d in zip(where, data):
        samples[w] += _num(d["Warp Stall Sampling (All Samples)"])
        executed[w] += _num(d["Instructions Executed"])
    total_s, total_i = sum(samples.values()) or 1.0, sum(executed.values()) or 1.0
    return "\n".join(f"  {w:24s} samples {s / total_s:6.1%}  instructions "
                     f"{executed[w] / total_i:6.1%}" for w, s in samples.most_common(top))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--cubin", help="the profiled kernel's machine code (source lines)")
    args = parser.parse_args(argv)
    for path in args.files:
        print(summary(path, args.top))
        if args.cubin:
            print(by_line(path, args.cubin, args.top))


if __name__ == "__main__":
    main()
