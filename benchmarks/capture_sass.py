"""Machine instructions of each step of the scan's capture (what a filtered or logprob program
runs after its stream), by path.

Usage: TRITON_INTERPRET=0 python3 -m benchmarks.capture_sass [--dump DIR] [--json]

Runs on a machine without a GPU, like `benchmarks.stream_sass`: it compiles one small kernel
per path for sm_90a (the lean scan's launch options, 1024 lanes, two chunks per program as from
batch 256) that loads a program's lane maxima and a cut, runs the one step of
`kernels._scan_kernel`'s capture it names, and stores its result. It prints each path's
machine instructions less those of the same kernel without the step: per thread, since the
steps are straight-line code (the radix searches are loops of FLOOR_PASSES passes, counted
once). A two-chunk program's stream issues ~64 elements x the per-element counts of
`stream_sass` per thread, which puts these in scale.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import triton
import triton.language as tl

from benchmarks.stream_sass import OPTIONS, instructions, machine_code
from graphshard.sample import floors
from graphshard.sample.floors import FLOOR_PASSES, FLOOR_RADIX_BITS, HOT_FEW, HOT_SOME
from graphshard.sample.grid import SCAN_BLOCK_SIZE
from graphshard.sample.workspace import HOT_TILE

CHUNK = 8192
VOCAB = 152064
CAP = 4096
GROUP = 2
PATHS = {
    "none": "the kernel without a step (subtracted from the others)",
    "shared_cut": "read the row's published cut and publish one (two scalar atomics)",
    "refine": "one pass of FLOOR_PIVOTS pivots over 1024 lane maxima (a need above 64)",
    "radix": "radix search over 1024 lane maxima, one pass (a row's first chunks)",
    "radix_small": "radix search over 256 folded maxima, one pass (first chunks, small need)",
    f"list_{HOT_FEW.value}": "count and list the hot lanes, read them back in the smallest tile",
    f"list_{HOT_SOME.value}": "the same with the middle tile",
    f"list_{HOT_TILE.value}": "the same with the widest tile",
}


@triton.jit
def _capture_kernel(row_ptr, lanes_ptr, out_ptr, ws_ptr, need, PATH: tl.constexpr,
                    SLOTS: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
                    CHUNK: tl.constexpr, VOCAB: tl.constexpr, CAP: tl.constexpr,
                    GROUP: tl.constexpr):
    lane_x = tl.load(lanes_ptr + tl.arange(0, BLOCK))  # [BLOCK]
    cut = tl.load(out_ptr + 1)
    fill = ws_ptr
    pool_x = ws_ptr + 2
    pool_id = pool_x + CAP
    hot_list = pool_id + CAP
    floor = cut
    if PATH == 1:
        floor = floors.share_floor(fill, floors.published_cut(fill))
    elif PATH == 2:
        floor = floors.refine_floor(lane_x, need, cut, tl.max(lane_x, axis=0))
    elif PATH == 3:
        floor = floors.chunk_floor(floors.fold_lanes(lane_x, BLOCK, LANES), need, LANES, 1,
                                   FLOOR_RADIX_BITS)
    elif PATH == 4:
        hot = lane_x >= cut
        num_hot = tl.sum(hot.to(tl.int32), axis=0)
        floors.list_hot(hot_list, hot, BLOCK)
        tl.debug_barrier()
        floors.capture_listed(row_ptr, row_ptr, 1, 0, fill, pool_x, pool_id, hot_list, num_hot,
                              1.0, cut, cut, VOCAB, CHUNK, CAP, BLOCK, False, GROUP, SLOTS)
    tl.store(out_ptr, floor)


def _path_args(name: str) -> dict:
    if name.startswith("list_"):
        return dict(PATH=4, SLOTS=int(name.split("_")[1]), LANES=SCAN_BLOCK_SIZE)
    code = {"none": 0, "shared_cut": 1, "refine": 2, "radix": 3, "radix_small": 3}[name]
    return dict(PATH=code, SLOTS=HOT_FEW.value,
                LANES=256 if name == "radix_small" else SCAN_BLOCK_SIZE)


def disassemble(name: str, tmp: str) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = dict(**_path_args(name), BLOCK=SCAN_BLOCK_SIZE, CHUNK=CHUNK, VOCAB=VOCAB, CAP=CAP,
                  GROUP=GROUP)
    sig = dict(row_ptr="*fp32", lanes_ptr="*fp32", out_ptr="*fp32", ws_ptr="*i32", need="i32",
               **{n: "constexpr" for n in consts})
    aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    compiled = triton.compile(ASTSource(fn=_capture_kernel, signature=sig, constexprs=consts,
                                        attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options=OPTIONS)
    return machine_code(compiled, tmp, name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", default=None, help="write each path's disassembly there")
    parser.add_argument("--json", action="store_true", help="one JSON list on the last line")
    args = parser.parse_args(argv)
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in PATHS:
            sass = disassemble(name, tmp)
            if args.dump:
                Path(args.dump).mkdir(parents=True, exist_ok=True)
                (Path(args.dump) / f"{name}.sass").write_text(sass)
            counts[name] = len(instructions(sass))
    rows = [dict(path=name, instructions=counts[name] - counts["none"], what=PATHS[name])
            for name in PATHS if name != "none"]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"FLOOR_PASSES = {FLOOR_PASSES.value}: a radix search runs its pass that many times.")
    print("| path | instructions per thread | what |")
    print("| --- | ---: | --- |")
    for r in rows:
        print(f"| {r['path']} | {r['instructions']} | {r['what']} |")


if __name__ == "__main__":
    main()
