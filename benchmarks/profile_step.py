"""Where one graphshard step spends its time, on 2 GPUs: host parts and device parts separately.

Usage: python3 -m benchmarks.profile_step [--vocab 152064] [--dtype float32] [--transport p2p]
    [--batches 1,32,256,1024] [--no-check]
Prints one table per batch size; every number is a median over many steps on rank 0. Then each
kernel of the decode-loop step (step, host read of the tokens, `raise_if_failed()`) with its mean
device µs per step on rank 0 (CUPTI; a barrier kernel's time includes its wait for the peer).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist

from graphshard.config import Config
from benchmarks.profile_kernels import kernel_us
from benchmarks.timing import events_us
from graphshard.harness.distributed import spawn
from graphshard.engine import Engine
from graphshard.sample.params import SamplingParams

BATCHES = (1, 32, 256, 1024)


def _median_us(fn, iters=200) -> float:
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e6)


def profile_rank(rank, world, vocab, dtype, transport, batches=BATCHES, check=True):
    cfg = Config(vocab_size=vocab, max_num_reqs=max(batches), max_num_slots=2 * max(batches),
                 logits_dtype=dtype, buckets=tuple(batches), transport=transport,
                 graph_backend="cuda", divergence_check=check)
    engine = Engine(cfg)
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SamplingParams(temperature=0.0))
    engine.capture()
    rows, kernels = [], []
    for n in batches:
        idx, cu = np.arange(n, dtype=np.int32), np.arange(n + 1, dtype=np.int32)
        lens = np.full(n, 100, np.int32)
        x = engine.inputs.logits[:n]
        x.normal_()
        out = engine.step(idx, cu, lens, x)
        key = engine._routes[n].key_for(idx, cu, engine.tp_size, engine._one_row)
        host = torch.empty_like(out.records, device="cpu").pin_memory()
        torch.cuda.synchronize()
        row = {"batch": n}
        row["check_us"] = _median_us(lambda: engine._check_step(idx, cu, lens, x, None, None))
        # Restages the last (finished) step's own row with the same batch: nothing in flight reads it.
        row["stage_us"] = _median_us(lambda: engine.inputs.stage(engine.steps - 1, idx, cu, lens, False))
        torch.cuda.synchronize()
        dist.barrier()
        row["replay_host_us"] = _median_us(lambda: engine.graphs.replay(key), iters=50)
        torch.cuda.synchronize()
        dist.barrier()
        row["step_issue_us"] = _median_us(lambda: engine.step(idx, cu, lens, x), iters=50)
        torch.cuda.synchronize()
        row["replay_gpu_us"] = events_us(lambda: engine.graphs.replay(key), iters=50, barrier=True)
        row["step_gpu_us"] = events_us(lambda: engine.step(idx, cu, lens, x), iters=50, barrier=True)
        torch.cuda.synchronize()
        row["read_pinned_us"] = _median_us(lambda: host.copy_(out.records), iters=50)
        row["read_cpu_us"] = _median_us(lambda: out.records.cpu(), iters=50)
        rows.append(row)
        dist.barrier()

        def loop_step():
            engine.step(idx, cu, lens, x).sampled_token_ids.cpu()
            engine.raise_if_failed()
        for name, us in kernel_us(loop_step, calls=100).items():
            kernels.append(dict(batch=n, kernel=name, us=us))
    engine.close()
    return rows, kernels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--transport", default="p2p")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--no-check", action="store_true", help="divergence_check = false")
    args = parser.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))
    rows, kernels = spawn(profile_rank, 2, args.vocab, args.dtype, args.transport, batches,
                          not args.no_check, backend="nccl", timeout_s=600)[0]
    keys = list(rows[0])
    print(f"transport={args.transport} vocab={args.vocab} dtype={args.dtype} "
          f"divergence_check={not args.no_check} (rank 0, medians)")
    print(" | ".join(f"{k:>14s}" for k in keys))
    for r in rows:
        print(" | ".join(f"{r[k]:14.1f}" for k in keys))
    print("kernels of the decode-loop step (rank 0, mean device µs per step)")
    for n in batches:
        mine = [k for k in kernels if k["batch"] == n]
        print(f"batch {n}: total {sum(k['us'] for k in mine):.1f} µs")
        for k in mine:
            print(f"  {k['us']:8.1f}  {k['kernel'][:100]}")


if __name__ == "__main__":
    main()
