"""Compile the sampler kernels of a `benchmarks.profile_kernels` run for sm_90 (H100/H200) into
the Triton cache ahead of the GPU run, on any machine. The sampler's launchers run on CPU
tensors while Triton's cache hook (`knobs.runtime.jit_cache_hook`) records each missing kernel
specialisation and skips it (nothing launches); worker processes then compile them in
parallel with `JITFunction.warmup` on the arguments kept from those launches, through Triton's
launch path, so the entries are those a launch on the GPU looks up. It runs in the tree whose kernels it builds
(that tree's `sampling_modes` sets the calls up); `benchmarks/ablations/trees.sh` copies it and
`profile_kernels.py` into the older trees of an ablation.

Why: compiled one after another, as a launch finds each missing, one source tree's sampler
variants for a few batches took over six minutes on the GPU machine, most of a device call.
Built here, the cache folder travels with the working tree (a device call's `carry`) and the
run finds every kernel compiled; on the GPU machine itself, `--jobs` compiles them on all its
cores at once.

Usage: TRITON_INTERPRET=0 TRITON_CACHE_DIR=DIR python3 -m benchmarks.prebuild [--jobs N] [--arch 90]
       [profile_kernels args: --vocab --dtype --modes --batches --k --bitmask --pdl
        --splits-per-program]
       TRITON_CACHE_DIR=DIR python3 -m benchmarks.prebuild --relocate
Run it from each source tree to be timed, with the same DIR: the cache is keyed by the
kernels' source. Prints one line per kernel compiled (seconds; well under one when DIR had it).
Then `--relocate`, here and again on the GPU machine before the run: Triton's cache names each
entry's files by absolute path, and a launch loads only the machine code and its metadata, so
it drops the intermediate files (a big finish variant's 14 MB become 2) and points the entries
at DIR where it now lies. The cache only hits with the same Triton on both machines: the key hashes its
Python files, its compiled library and its ptxas version. The GPU machine runs Python 3.12,
whose wheel's library differs from another Python's; give `--libtriton` that wheel's
`triton/_C/libtriton.so` (`python3 -m pip download triton==3.6.0 --no-deps --only-binary=:all:
--python-version 3.12 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 -d DIR`,
then `unzip -j DIR/triton-*.whl triton/_C/libtriton.so -d .triton_lib/cp312`). The engine
step's own kernels are not covered.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import queue
import sys
import sysconfig
import time
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget

from benchmarks.cache_pack import relocate
from benchmarks.profile_kernels import parse_args, sampler_calls
from graphshard.sample.kernels import _finish_kernel, _scan_kernel


def compile_only(arch: int) -> None:
    """Make this process compile for sm_`arch` without a GPU: the compile-only driver, and the
    sampler's check that its device can launch programmatic dependents (`--pdl`) set aside, as
    nothing here launches."""
    import graphshard.sample.kernels as kernels

    triton.runtime.driver.set_active(CompileOnlyDriver(arch))
    kernels.check_pdl = lambda *args: None


class CompileOnlyDriver:
    """What Triton's launch path asks of a driver before it compiles: a device, a stream and
    the target. Nothing here can launch."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def collect(calls, kernels) -> list[tuple]:
    """(kernel name, jit function, args, kwargs) of each distinct specialisation of `kernels`
    that the zero-argument `calls` would compile, in the order first met (the order `calls`
    launch them in must be the GPU run's); nothing runs. The arguments are kept whole (tensors
    too): `JITFunction.warmup` then compiles through the launch path itself (a record for
    `JITFunction.preload` would lose a NamedTuple argument's field names)."""
    found, last = {}, {}

    def remember(kernel):
        def hook(*args, **kwargs):
            last[kernel] = (args, kwargs)
        return hook

    def record(*, key, fn, is_manual_warmup, **_):
        if is_manual_warmup:  # a worker's compile: let it through
            return False
        args, kwargs = last[fn.jit_function]
        found.setdefault((fn.name, str(key)), (fn.name, fn.jit_function, args, kwargs))
        return True  # skip the compile, and with it the launch

    hooks = [(k, remember(k)) for k in kernels]
    for k, hook in hooks:
        k.add_pre_run_hook(hook)
    knobs.runtime.jit_cache_hook = record
    try:
        for call in calls:
            call()
    finally:
        knobs.runtime.jit_cache_hook = None
        for k, hook in hooks:
            k.pre_run_hooks.remove(hook)
    # Triton 3.6's key of a kernel depends on which kernels' keys the process computed before
    # it: a caller folds in the constant globals of the helpers whose keys are already known,
    # and not of those it computes itself (the scan's and the finish's keys both change with
    # the order). A GPU run computes each key at its kernel's first launch; computed here in
    # that order, before the workers fork, the keys are the run's.
    for fn in dict.fromkeys(fn for _, fn, _, _ in found.values()):
        fn.cache_key
    return list(found.values())


def _compile_some(items, todo, done):
    while (i := todo.get()) is not None:
        name, fn, args, kwargs = items[i]
        start = time.perf_counter()
        with torch._C.DisableTorchFunction():  # as `runtime.launch` launches
            fn.warmup(*args, grid=(1,), **kwargs)
        done.put((i, name, time.perf_counter() - start))


def compile_all(items: list[tuple], jobs: int) -> list[tuple]:
    """(index, name, seconds) per item, compiled by `jobs` forked workers (they inherit the
    records; nothing is pickled)."""
    ctx = multiprocessing.get_context("fork")
    todo, done = ctx.Queue(), ctx.Queue()
    for i in range(len(items)):
        todo.put(i)
    for _ in range(jobs):
        todo.put(None)
    workers = [ctx.Process(target=_compile_some, args=(items, todo, done)) for _ in range(jobs)]
    for w in workers:
        w.start()
    results = []
    while len(results) < len(items):
        try:
            results.append(done.get(timeout=5))
        except queue.Empty:
            if not any(w.is_alive() for w in workers):
                break
            continue
        print(f"{results[-1][1]:>24s} #{results[-1][0]:<3d} {results[-1][2]:7.1f} s", flush=True)
    for w in workers:
        w.join()
    if len(results) < len(items) or any(w.exitcode for w in workers):
        raise RuntimeError(f"compiled {len(results)} of {len(items)} kernels: worker exit "
                           f"codes {[w.exitcode for w in workers]}")
    return results


def key_for_library(libtriton: Path) -> None:
    """Key this process's compiles for a machine whose Triton is this one but for its compiled
    library: the wheel of the same version for another Python (the GPU machine's is 3.12).
    Triton's cache key hashes that file with its Python sources (the same in both wheels, and
    so are ptxas and libdevice), so only its hash is swapped."""
    from triton.runtime import cache

    def sha256(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    ext = sysconfig.get_config_var("EXT_SUFFIX").split(".")[-1]
    here = Path(triton.__file__).parent / "_C" / f"libtriton.{ext}"
    key, ours = cache.triton_key(), sha256(here)
    if ours not in key:
        raise RuntimeError("this Triton's cache key no longer hashes its library as expected")
    swapped = key.replace(ours, sha256(libtriton))
    cache.triton_key = lambda: swapped


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--jobs", type=int, default=os.cpu_count())
    extra.add_argument("--arch", type=int, default=90)
    extra.add_argument("--libtriton", type=Path, default=None,
                       help="the GPU machine's triton/_C/libtriton.so, where its Python differs "
                            "from this one's (see the module's docstring)")
    extra.add_argument("--relocate", action="store_true",
                       help="only point the cache's entries at where it lies, and prune them")
    opts, rest = extra.parse_known_args(argv)
    if "TRITON_CACHE_DIR" not in os.environ:
        sys.exit("set TRITON_CACHE_DIR to the cache folder the GPU run will read")
    if opts.relocate:
        entries, size = relocate(Path(os.environ["TRITON_CACHE_DIR"]))
        print(f"{entries} cache entries, {size / 2**20:.1f} MiB")
        return
    args = parse_args(rest)
    if os.environ.get("TRITON_INTERPRET") == "1":
        # Importing graphshard turns the interpreter on where there is no CUDA.
        sys.exit("the kernels were loaded for the interpreter: run with TRITON_INTERPRET=0")
    compile_only(opts.arch)
    if opts.libtriton is not None:
        key_for_library(opts.libtriton)
    start = time.perf_counter()
    items = collect((call for _, _, call, _ in sampler_calls(args, torch.device("cpu"))),
                    [_scan_kernel, _finish_kernel])
    if not items:
        sys.exit("no kernel to compile: every one was in this process's memory already")
    print(f"{len(items)} kernel variants; compiling with {opts.jobs} workers", flush=True)
    compile_all(items, max(1, min(opts.jobs, len(items))))
    print(f"done in {time.perf_counter() - start:.0f} s -> {os.environ['TRITON_CACHE_DIR']}")


if __name__ == "__main__":
    main()
