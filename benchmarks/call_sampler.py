"""Launch the sampler a few times for one mode and batch, with nothing else in the process: the
program `benchmarks/counters.sh` runs under Nsight Compute (no torch.profiler, which uses the same
profiling interface of the GPU).

Usage: python3 -m benchmarks.call_sampler --mode top_k_top_p --batch 1024 [--vocab 152064]
       [--dtype float32] [--k 20] [--calls 4] [--splits-per-program N]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.sampling_modes import MODES, make_logits, sampler_call


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True, choices=sorted(MODES))
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--k", type=int, default=20, help="layout K")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--splits-per-program", type=int, default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    logits = make_logits(args.batch, args.vocab, getattr(torch, args.dtype), device)
    call, ws = sampler_call(logits, args.vocab, MODES[args.mode], args.k, device,
                            splits_per_program=args.splits_per_program)
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    print(f"{args.mode} batch {args.batch}: {args.calls} calls, paths {ws.paths()}")


if __name__ == "__main__":
    main()
