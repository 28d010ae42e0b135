"""Compile the sampler variants an engine's `capture()` compiles, for sm_90 (H100/H200), into
the Triton cache on a machine without a GPU, so that a GPU run's capture finds them all.

The mixed workload's engine (`benchmarks.mixed_steps`) compiles its sampler variants at capture
for 200-320 s of a GPU call (one finish variant bounds it); built here, its cache travels in as
a pack (`benchmarks.cache_pack`, `mixed_ab_call.sh`'s MIXED_PACK) and the capture loads them.

The engine is built on the CPU at tp = 1 as it would be on an sm_90 GPU: programmatic launches
where the config asks for them, graphs without bitmask support at tp = 1. Its `capture()` runs up
to its compile of the sampler variants, which records each graph's and each eager step's
sampler launches (`StepParts.sampler_launches` over the capture's keys) and stops there; the
recorded launches then compile through `runtime.launch.compile_launches`, as the capture does,
in the same order (Triton 3.6 keys a kernel by the kernels keyed before it). The engine's own
small kernels (fetch, plan, publish) compile in seconds at their first launch and are left out.

Usage: TRITON_INTERPRET=0 TRITON_CACHE_DIR=DIR python3 -m benchmarks.prebuild_engine
       [--config mixed|PATH.toml] [--workers N] [--arch 90] [--libtriton PATH] [--list]
`--libtriton`: the GPU machine's `triton/_C/libtriton.so` (its Python is 3.12; see
`benchmarks.prebuild`). `--list` prints the variants without compiling them. Then, for
`mixed_ab_call.sh`: DIR named `mixed_cache`, and `python3 -m benchmarks.cache_pack pack
.triton_pack/mixed DIR`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from graphshard.config import Config


class _Recorded(Exception):
    """Raised from the capture's compile step, with the keys it would compile."""


def engine_as_on_gpu(cfg: Config, arch: int):
    """The tp = 1 engine of `cfg`, built on the CPU as on an sm_`arch` GPU whose kernels are
    compiled (no interpreter): nothing it builds launches a kernel."""
    import graphshard.engine.engine as engine_module
    import graphshard.runtime.pdl as pdl
    from benchmarks.prebuild import compile_only

    compile_only(arch)
    # As on the GPU: sm_90 launches programmatic dependents, and its kernels are compiled.
    pdl._supports_pdl = lambda device: arch >= 90
    engine_module.check_kernels_run_on = lambda device: None
    return engine_module.Engine(cfg.replace(graph_backend="emulated"), device="cpu")


def capture_keys(engine) -> list[tuple]:
    """The step keys whose sampler launches `engine.capture()` compiles ahead: its capture, up
    to that compile."""
    def stop(keys):
        raise _Recorded(list(keys))

    engine._compile_samplers = stop
    try:
        engine.capture()
    except _Recorded as recorded:
        return recorded.args[0]
    raise RuntimeError("capture() ran past its compile of the sampler variants")


def variants(engine) -> list:
    """One recorded launch per distinct sampler variant of the capture, in launch order."""
    from graphshard.runtime.launch import distinct_variants

    return distinct_variants(engine.parts.sampler_launches(capture_keys(engine)))


def load_config(name: str) -> Config:
    if name == "mixed":
        from benchmarks.mixed_steps import MIXED

        return MIXED
    return Config.from_toml(name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="mixed",
                    help="'mixed' (benchmarks.mixed_steps' config) or a TOML config")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--libtriton", type=Path, default=None)
    ap.add_argument("--list", action="store_true", help="print the variants, compile nothing")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "0":
        sys.exit("run with TRITON_INTERPRET=0: the kernels must be loaded to compile")
    if "TRITON_CACHE_DIR" not in os.environ and not args.list:
        sys.exit("set TRITON_CACHE_DIR to the cache folder the GPU run will read")
    cfg = load_config(args.config)
    if args.libtriton is not None:
        from benchmarks.prebuild import key_for_library

        key_for_library(args.libtriton)
    engine = engine_as_on_gpu(cfg, args.arch)
    found = variants(engine)
    print(f"{len(found)} sampler variants (programmatic launches: {engine.programmatic_launch}, "
          f"graphs without bitmask support: {engine.bitmask_free_graphs})", flush=True)
    for item in found:
        flags = {k: v for k, v in item.kwargs.items() if k.isupper()}
        print(f"  {item.kernel.fn.__name__} grid {tuple(item.grid)} {flags}")
    if args.list:
        return
    from graphshard.runtime.launch import compile_launches

    start = time.perf_counter()
    compiled = compile_launches(found, args.workers)
    print(f"{compiled} compiled or loaded in {time.perf_counter() - start:.0f} s with "
          f"{args.workers} workers -> {os.environ['TRITON_CACHE_DIR']}")


if __name__ == "__main__":
    main()
