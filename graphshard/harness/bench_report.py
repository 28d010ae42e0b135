"""The sweep's results: merge the ranks (the slowest one counts), tables, and the files.

`loop.json` is a list of rows with keys path, batch, vocab, dtype, tp, step_us, issue_us,
step_p90_us, same_tokens, agreement (whether the in-graph divergence check was on: the default
for graphshard paths at tp > 1; `_unchecked` paths run the same step with it off), and aligned_step_us
(the barrier-aligned step, when measured). `auto.json` holds the auto strategy's per-bucket
choices and timings; `loop.md` the tables; `loop.png` a plot where matplotlib is installed.
Nothing here needs a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

TP_PATHS = ("bare_allgather_graph", "graphshard_p2p", "graphshard_p2p_unchecked", "graphshard_nccl",
            "graphshard_nccl_unchecked", "graphshard_replicate", "graphshard_auto", "eager_shard",
            "eager_allgather")
TP1_PATHS = ("graphshard_tp1", "captured_argmax")
PATHS = TP_PATHS + TP1_PATHS
ROW_KEYS = ("path", "batch", "vocab", "dtype", "tp", "step_us", "issue_us", "step_p90_us",
            "same_tokens", "agreement")
_SLOWEST = ("step_us", "issue_us", "step_p90_us", "aligned_step_us")


def summarize(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (vocab, dtype, tp, batch, path): each time the slowest rank's (a step ends
    when every rank's has), tokens the same only if they were on every rank."""
    merged: dict[tuple, dict] = {}
    for rows in per_rank:
        for row in rows:
            key = (row["vocab"], row["dtype"], row["tp"], row["batch"], row["path"])
            cur = merged.get(key)
            if cur is None:
                merged[key] = {k: v for k, v in row.items() if k != "rank"}
                continue
            for k in _SLOWEST:
                if k in row:
                    cur[k] = max(cur[k], row[k])
            cur["same_tokens"] = cur["same_tokens"] and row["same_tokens"]
            cur["agreement"] = cur["agreement"] or row["agreement"]
    order = {p: i for i, p in enumerate(PATHS)}
    return sorted(merged.values(), key=lambda r: (r["vocab"], r["dtype"], -r["tp"], r["batch"],
                                                  order.get(r["path"], len(order)), r["path"]))


def headline_table(rows: list[dict]) -> str:
    """Batches down, paths across: median step µs (median host issue µs), as in issue 12."""
    lines = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["vocab"], r["dtype"], r["tp"]), []).append(r)
    for (vocab, dtype, tp), group in groups.items():
        paths = list(dict.fromkeys(r["path"] for r in group))
        lines += [f"V = {vocab}, {dtype}, tp = {tp}: back-to-back decode loop, slowest rank's "
                  "median step µs (median host issue µs)", "",
                  "| batch | " + " | ".join(paths) + " |", "| ---: |" + " ---: |" * len(paths)]
        cells: dict[int, dict[str, dict]] = {}
        for r in group:
            cells.setdefault(r["batch"], {})[r["path"]] = r
        for batch, by_path in cells.items():
            lines.append(f"| {batch} | " + " | ".join(_cell(by_path.get(p)) for p in paths) + " |")
        lines.append("")
    return "\n".join(lines)


def _cell(r: dict | None) -> str:
    if r is None:
        return "–"
    flag = "" if r["same_tokens"] else " ✗"
    return f"{r['step_us']:.0f} ({r['issue_us']:.0f}){flag}"


def full_table(rows: list[dict]) -> str:
    """Every row with every number."""
    head = ("| vocab | dtype | tp | batch | path | step µs | p90 µs | issue µs | aligned step µs | "
            "same tokens |")
    lines = [head, "|" + " --- |" * 5 + " ---: |" * 4 + " --- |"]
    for r in rows:
        aligned = f"{r['aligned_step_us']:.0f}" if "aligned_step_us" in r else "–"
        lines.append(f"| {r['vocab']} | {r['dtype']} | {r['tp']} | {r['batch']} | {r['path']} | "
                     f"{r['step_us']:.0f} | {r['step_p90_us']:.0f} | {r['issue_us']:.1f} | {aligned} | "
                     f"{'yes' if r['same_tokens'] else 'NO'} |")
    return "\n".join(lines)


def auto_table(auto: list[dict]) -> str:
    """The auto strategy's choice per bucket, with what it measured (µs per replay)."""
    lines = []
    for a in auto:
        lines += [f"auto strategy, V = {a['vocab']}, {a['dtype']} (capture {a['capture_s']:.1f} s):",
                  "", "| bucket | chosen | shard µs | replicate µs |", "| ---: | --- | ---: | ---: |"]
        for bucket, chosen in sorted(a["strategy"].items(), key=lambda kv: int(kv[0])):
            t = a["timings_us"].get(bucket) or a["timings_us"].get(str(bucket)) or {}
            lines.append(f"| {bucket} | {chosen} | {t.get('shard', float('nan')):.0f} | "
                         f"{t.get('replicate', float('nan')):.0f} |")
        lines.append("")
    return "\n".join(lines)


def write_results(out_dir: Path, rows: list[dict], auto: list[dict], settings: dict) -> str:
    """loop.json, auto.json and loop.md under `out_dir`; returns the Markdown."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "loop.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out_dir / "auto.json").write_text(json.dumps({"settings": settings, "auto": auto}, indent=1) + "\n")
    text = "\n".join([headline_table(rows), auto_table(auto), full_table(rows)])
    (out_dir / "loop.md").write_text(text + "\n")
    plot(rows, out_dir / "loop.png")
    return text


def plot(rows: list[dict], path: Path) -> None:
    """Median step µs against batch, one panel per (vocab, dtype, tp); skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    panels = sorted({(r["vocab"], r["dtype"], r["tp"]) for r in rows}, key=lambda p: (p[0], p[1], -p[2]))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (vocab, dtype, tp) in zip(axes[0], panels):
        mine = [r for r in rows if (r["vocab"], r["dtype"], r["tp"]) == (vocab, dtype, tp)]
        for name in dict.fromkeys(r["path"] for r in mine):
            points = sorted((r["batch"], r["step_us"]) for r in mine if r["path"] == name)
            ax.plot(*zip(*points), marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="step µs (median, decode loop)",
               title=f"V={vocab} {dtype} tp={tp}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
