"""Which rows of repeated sampler calls leave the candidate path, and what their pools held.

Usage: python3 -m benchmarks.path_probe [--vocab 152064] [--dtype float32] [--mode top_p]
       [--batch 32] [--k 20] [--pdl] [--calls 60] [--out DIR]

The sampler's path counters (`SamplerWorkspace.paths`) are per workspace, not per row. This probe
runs one mode's sampler call (`benchmarks.sampling_modes.sampler_call`, the inputs
`benchmarks.profile_kernels` times) repeatedly, two ways: each call followed by a host sync
(`synced`), and calls back to back, each followed by a device copy of the workspace (`chained`:
closer to the profile's timing, where the scan's shared capture cut races differently). After
each call it rebuilds every random row's pool on the host from the chunks' reported floors
(every token at or above its chunk's floor was captured) and prints, for the calls whose
counters moved and for rows near their pool's edge, what decides the finish's path: the pool's
size, its mass above the floor against top_p times the norm (float64), where the threshold and
the unfiltered winner lie against the floor, and any row whose pool word the launch left set
(`pool_words_left`: every launch should leave them at zero). With --out it saves, for each
call whose counters moved, every row's partials and the printed rows' pools as
`DIR/call_<way>_<i>.npz`, and those rows' logits once as `DIR/rows.npz`, to replay the finish
off the GPU. (`benchmarks.floor_audit` checks the capture floors themselves against their
bounds; this probe follows what the finish does with them, and the pool words it leaves.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from benchmarks.profile_kernels import compile_ahead
from benchmarks.sampling_modes import MODES, make_logits, sampler_call
from graphshard.sample.workspace import (NUM_PART, P_ARG_Z, P_FLOOR_S, P_MAX_Z, STAT_NAMES)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--mode", default="top_p", choices=sorted(MODES))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--pdl", action="store_true")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda", help="cpu runs the Triton interpreter")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.calls < 1:
        parser.error("--batch and --calls must be >= 1")
    return args


def as_float(bits: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(bits).view(np.float32)


def winner(partials: np.ndarray) -> int:
    """The unfiltered Gumbel winner from a row's chunks [NUM_PART, SPLITS]: max z, lowest id."""
    z, ids = as_float(partials[P_MAX_Z]), partials[P_ARG_Z]
    return int(ids[z == z.max()].min())


class Row:
    """A top-p row's scores and nucleus (float64 masses), fixed across calls."""

    def __init__(self, x: np.ndarray, chunk: int, inv_temp: np.float32, top_p: float):
        self.x, self.inv_temp = x, inv_temp
        self.s = x * inv_temp  # float32, as the kernels round it
        self.w = np.exp(self.s.astype(np.float64) - float(self.s.max()))
        self.target = top_p * self.w.sum()
        desc = np.sort(self.s)[::-1]
        mass = np.cumsum(np.exp(desc.astype(np.float64) - float(desc[0])))
        self.threshold = desc[min(np.searchsorted(mass, self.target), desc.size - 1)]
        self.chunk_of = np.arange(x.size) // chunk

    def describe(self, partials: np.ndarray) -> dict:
        """What decides the row's finish in a call whose chunks left `partials`."""
        s, w = self.s, self.w
        floors = as_float(partials[P_FLOOR_S])
        floor_x = floors.max()
        lo = np.nextafter(floor_x, np.float32(-np.inf)) * self.inv_temp
        captured = self.x >= floors[self.chunk_of]
        won = winner(partials)
        v_s = s[won]
        return dict(n_pool=int(captured.sum()), floor_x=float(floor_x), lo=float(lo),
                    threshold=float(self.threshold),
                    nucleus=int((s >= self.threshold).sum()),
                    pool_over_target=float(w[captured & (s >= lo)].sum() / self.target),
                    missing=int(((s > lo) & ~captured).sum()),
                    winner=won, winner_below=bool(v_s <= lo),
                    winner_kept=bool(w[s > v_s].sum() < self.target))


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    params = MODES[args.mode]
    logits = make_logits(args.batch, args.vocab, getattr(torch, args.dtype), device)
    call, ws = sampler_call(logits, args.vocab, params, args.k, device, pdl=args.pdl)
    compile_ahead([call])
    call()
    host_x = logits.float().cpu().numpy()
    inv_temp = np.float32(1.0) / np.float32(params.temperature)
    rows, splits, cap = args.batch, ws.num_splits, ws.pool_size
    facts = [Row(host_x[r], ws.chunk_size, inv_temp, params.top_p) for r in range(rows)]
    names = list(STAT_NAMES)

    def snapshot():
        return (ws.stats.clone(), ws.partials.clone(), ws.pool.clone(), ws.fill.clone())

    def report(way, i, stats_before, snap):
        stats, parts, pool, fill = (t.cpu().numpy() for t in snap)
        moved = {n: int(stats[STAT_NAMES[n]] - stats_before[STAT_NAMES[n]]) for n in names}
        moved = {n: v for n, v in moved.items() if v}
        # Every launch leaves every row's pool word at zero; one left set is the next launch's
        # count (and its finish programs' arrivals), and the row's pool stays unusable.
        left = {r: hex(int(fill[2 * r]) & 0xFFFFFFFF) for r in range(rows) if fill[2 * r]}
        if left:
            moved["pool_words_left"] = left
        parts = parts.reshape(rows, NUM_PART, splits)
        described = [(r, facts[r].describe(parts[r])) for r in range(rows)]
        near = [(r, d) for r, d in described if d["missing"] or d["winner_below"]
                and abs(d["pool_over_target"] - 1.0) < 0.02]
        if moved and not near:
            near = [(r, d) for r, d in described if d["winner_below"]]
        if moved or near:
            print(f"{way} call {i}: paths moved {moved}")
            for r, d in near:
                print(f"  row {r}: " + " ".join(f"{k}={v:.9g}" if isinstance(v, float)
                                                 else f"{k}={v}" for k, v in d.items()))
        if moved and args.out is not None:
            keep = [r for r, _ in near]
            flagged.update(keep)
            np.savez_compressed(args.out / f"call_{way}_{i}.npz", rows=np.array(keep, int),
                                partials=parts, pool=pool.reshape(rows, 2, cap)[keep],
                                moved=str(moved))
        return stats

    flagged = set()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    stats = ws.stats.clone().cpu().numpy()
    for i in range(args.calls):
        call()
        stats = report("synced", i, stats, snapshot())
    snaps = []
    for i in range(args.calls):
        call()
        snaps.append(snapshot())
    for i, snap in enumerate(snaps):
        stats = report("chained", i, stats, snap)
    print("total paths", ws.paths())
    if args.out is not None and flagged:
        keep = sorted(flagged)
        np.savez_compressed(args.out / "rows.npz", rows=np.array(keep), logits=host_x[keep],
                            chunk=ws.chunk_size, inv_temp=inv_temp, top_p=params.top_p)


if __name__ == "__main__":
    main()
