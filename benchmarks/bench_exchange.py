"""Exchange microbenchmark on 2 GPUs: p2p pushes vs padded NCCL all-to-all vs eager uneven a2a.

Usage: python3 -m benchmarks.bench_exchange [--vocab 152064] [--dtype float32] [--out FILE]
Rows are owned alternately (slot = row), so half of each rank's rows cross the link. GPU time of
the exchange alone, from CUDA events around a graph replay (p2p, nccl) or the eager call; GB/s
counts only the real rows that cross the link, against a peer copy measured in the same run.
`p2p_step` is a shard step's transport part as the engine issues it (exchange without its start
barrier, then the record gather whose end barrier closes the step); `p2p_step_fenced` is the same
with the start barrier, as before the engine dropped it.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.distributed as dist

from benchmarks.timing import events_us, measure_peak_p2p_gbs
from graphshard.harness.distributed import spawn
from graphshard.engine import DTYPES
from graphshard.plan.kernel import plan
from graphshard.plan.layout import PlanBuffers, owner_ranks
from graphshard.transports import make_transport

ROWS = (1, 8, 64, 256, 1024)
P2P_BLOCKS = (64, 128, 256)


def _graph(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def bench_rank(rank, world, vocab, dtype_name):
    dtype = DTYPES[dtype_name]
    max_rows, vocab_shard = max(ROWS), vocab // world
    device = torch.device("cuda", rank)
    buf = PlanBuffers.allocate(max_rows, 1, world, device)
    logits = torch.randn(max_rows, vocab_shard, device=device).to(dtype)
    records = torch.zeros(max_rows, 4, dtype=torch.int32, device=device)
    transports = {f"p2p_{b}": make_transport("p2p", None, device, num_blocks=b) for b in P2P_BLOCKS}
    transports["nccl"] = make_transport("nccl", None, device)
    for t in transports.values():
        t.setup(max_num_rows=max_rows, max_num_reqs=max_rows, vocab_shard=vocab_shard,
                logits_dtype=dtype, record_width=4, device=device)
    rows_out = []
    for n in ROWS:
        idx = torch.arange(max_rows, dtype=torch.int32, device=device)
        plan(buf, idx_mapping=idx, cu_num_logits=torch.arange(max_rows + 1, dtype=torch.int32, device=device),
             seq_lens=idx, num_reqs=torch.tensor([n], dtype=torch.int32, device=device), tp_rank=rank,
             gather_stride=n, max_num_logits_per_req=1)
        remote = int((owner_ranks(np.arange(n), world) != rank).sum())
        crossing = remote * vocab_shard * logits.element_size()
        result = {"rows": n, "bytes_crossing": crossing}
        for name, t in transports.items():
            if name == "nccl":
                cap = t.pick_capacity(n, -(-n // world))
                g = _graph(lambda t=t, cap=cap: t.exchange(buf, logits, None, cap))
            else:
                g = _graph(lambda t=t: t.exchange(buf, logits, None, n))
            result[name] = events_us(g.replay, barrier=True)
        step_transport = transports[f"p2p_{P2P_BLOCKS[-1]}"]
        for name, fenced in (("p2p_step_fenced", True), ("p2p_step", False)):
            step_transport.barrier()  # the exchanges above leave it open: start this one closed
            g = _graph(lambda t=step_transport, fenced=fenced: (
                t.exchange(buf, logits, None, n, fenced=fenced), t.gather(buf, records, None, n, n)))
            result[name] = events_us(g.replay, barrier=True)
        owner = owner_ranks(np.arange(n), world)
        splits = np.bincount(owner, minlength=world).tolist()
        send_rows = torch.from_numpy(np.argsort(owner, kind="stable")).to(device)

        def eager():
            send = logits.index_select(0, send_rows)
            recv = torch.empty(splits[rank] * world, vocab_shard, dtype=dtype, device=device)
            dist.all_to_all_single(recv, send, output_split_sizes=[splits[rank]] * world,
                                   input_split_sizes=splits)

        result["eager_a2a"] = events_us(eager, barrier=True)
        rows_out.append(result)
    return rows_out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = spawn(bench_rank, 2, args.vocab, args.dtype, backend="nccl", timeout_s=600)
    peak = measure_peak_p2p_gbs()
    names = [k for k in results[0][0] if k not in ("rows", "bytes_crossing")]
    print(f"exchange GPU us (slowest rank), vocab={args.vocab} {args.dtype}; peer copy peak {peak:.0f} GB/s")
    print(f"{'rows':>6} {'MB/rank':>8} " + " ".join(f"{n:>10s}" for n in names) + "  best GB/s  % peak")
    table = []
    for i, r0 in enumerate(results[0]):
        worst = {n: max(res[i][n] for res in results) for n in names}
        mb = r0["bytes_crossing"] / 1e6
        best = min(worst.values())
        gbs = r0["bytes_crossing"] / (best * 1e-6) / 1e9
        print(f"{r0['rows']:6d} {mb:8.2f} " + " ".join(f"{worst[n]:10.1f}" for n in names)
              + f"  {gbs:9.0f}  {100 * gbs / peak:6.1f}")
        table.append({"rows": r0["rows"], "bytes_crossing": r0["bytes_crossing"], **worst})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"peak_gbs": peak, "vocab": args.vocab, "dtype": args.dtype, "rows": table}, f, indent=1)


if __name__ == "__main__":
    main()
