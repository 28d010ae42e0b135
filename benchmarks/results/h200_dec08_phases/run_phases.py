"""Phase cycles of the finish (instrumented copy): python3 run_phases.py (from the tree root)."""
import subprocess, sys
import numpy as np
import torch
from benchmarks.sampling_modes import MODES, make_logits, sampler_call

V = 152064
NAMES = ["prelude", "to_pivots", "copy", "sort", "to_thr", "draw", "tail"]
for mode, batch in [("top_p", 1), ("top_p", 32), ("top_p", 256), ("top_k_top_p", 1), ("top_k_top_p", 32)]:
    logits = make_logits(batch, V, torch.float32, "cuda")
    call, ws = sampler_call(logits, V, MODES[mode], 0, "cuda")
    cap = ws.pool_size
    pool = ws.pool.view(-1, 2, cap)[:batch]
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    rows = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(20):
        pool[:, 0, cap - 16:] = 0
        torch.cuda.synchronize()
        start.record(); call(); end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end))
        t = pool[:, 0, cap - 16:cap - 8].cpu().numpy().astype(np.int64)
        rows.append(t)
    t = np.concatenate(rows)  # [calls*batch, 8]
    d = {}
    have = t != 0
    prev = 0
    out = []
    for i in range(1, 8):
        if have[:, i].all():
            dd = (t[:, i] - t[:, prev]) % (1 << 32)
            out.append(f"{prev}->{i} {np.median(dd):.0f}")
            prev = i
    total = (t[:, 7] - t[:, 0]) % (1 << 32)
    print(f"{mode} b{batch}: event us {np.median(ms)*1000:.1f}; finish cycles 0->7 median {np.median(total):.0f} "
          f"p90 {np.percentile(total, 90):.0f}; phases (median cycles): {', '.join(out)}", flush=True)
print(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm", "--format=csv"], capture_output=True, text=True).stdout)
