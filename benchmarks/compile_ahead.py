"""Wall time of compiling the sampler variants of a `benchmarks.profile_kernels` run as it
compiles them (`profile_kernels.compile_ahead`: `graphshard.runtime.launch.compile_launches`,
what `Engine.capture()` does before its warm-up runs), on 1 to N threads. Without CUDA it
compiles for sm_90 (`--arch`) and nothing can launch.

Usage: TRITON_INTERPRET=0 TRITON_CACHE_DIR=EMPTY_DIR python3 -m benchmarks.compile_ahead
       [--workers N] [--arch 90] [profile_kernels args: --vocab --dtype --modes --batches --k
       --bitmask --pdl --splits-per-program]
Give each run an empty cache folder: a variant found in the cache loads in well under a second.
Prints the variants, the workers and the seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from benchmarks.prebuild import compile_only
from benchmarks.profile_kernels import compile_ahead, parse_args, sampler_calls
from graphshard.runtime.launch import compile_workers


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--workers", type=int, default=compile_workers())
    extra.add_argument("--arch", type=int, default=90)
    opts, rest = extra.parse_known_args(argv)
    args = parse_args(rest)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("the kernels were loaded for the interpreter: run with TRITON_INTERPRET=0")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        compile_only(opts.arch)
    calls = [call for _, _, call, _ in sampler_calls(args, device)]
    start = time.perf_counter()
    variants = compile_ahead(calls, opts.workers)
    seconds = time.perf_counter() - start
    print(f"{len(calls)} sampler calls, {variants} variants, {opts.workers} workers: "
          f"{seconds:.1f} s -> {os.environ.get('TRITON_CACHE_DIR', '~/.triton/cache')}")


if __name__ == "__main__":
    main()
