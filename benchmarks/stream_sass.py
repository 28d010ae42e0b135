"""Machine instructions per element of the sampler's streaming pass, by what the pass keeps.

Usage: TRITON_INTERPRET=0 python3 -m benchmarks.stream_sass [--dtypes float32,bfloat16]
       [--dump DIR] [--json]

Runs on a machine without a GPU: it compiles `rows.scan_span` (for logprob rows the first try
of `rows.sum_chunk`, whole: no loop) over one 8192-column chunk
(SCAN_BLOCK_SIZE lanes, the lean scan's launch options) for sm_90a with the ptxas and nvdisasm
that Triton ships and prints the program's machine instructions per element for six variants:
greedy (maxima only), the raw logits' softmax sum (logprob rows), the scores' (top-p rows),
both, the Gumbel race of an unfiltered random row (`draw`), and the race with the scores' sum
of a top-p-only row at small batch (`draw_sum_s`, `kernels.nucleus_winner`). The streaming pass
of a filtered or logprob row is bound by instruction issue (BENCHMARKS.md, "The capture modes
were bound by instruction issue"), so these counts weigh a change to it before a GPU times it.
--dump writes each variant's disassembly there.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.language as tl

from graphshard.sample import rows
from graphshard.sample.grid import SCAN_BLOCK_SIZE, scan_options

CHUNK = 8192
VOCAB = 152064
VARIANTS = {"greedy": (False, False, False), "sum_r": (False, False, True),
            "sum_s": (False, True, False), "both": (False, True, True),
            "draw": (True, False, False), "draw_sum_s": (True, True, False)}  # (DRAW, SUM_S, SUM_R)
OPTIONS = scan_options(False, SCAN_BLOCK_SIZE)  # the lean scan's: no bitmask support
THREADS = OPTIONS["num_warps"] * 32


@triton.jit
def _stream_kernel(row_ptr, out_ptr, inv_temp, key, DRAW: tl.constexpr, SUM_S: tl.constexpr,
                   SUM_R: tl.constexpr, CHUNK: tl.constexpr, VOCAB: tl.constexpr,
                   BLOCK: tl.constexpr):
    if rows.sums_in_steps(DRAW, SUM_S, SUM_R, False):
        # A logprob row's pass as it runs on a row without NaNs: `rows.sum_chunk`'s
        # first try (its second, with NaNs cleaned, runs only on a chunk that holds one).
        nan, max_x, arg_x, max_z, arg_z, lane_x, lane_r, mass_s, mass_r = rows.sum_steps(
            row_ptr, tl.program_id(0) * CHUNK, CHUNK, VOCAB, BLOCK, False)
    else:
        nan, max_x, arg_x, max_z, arg_z, lane_x, lane_r, mass_s, mass_r = rows.scan_span(
            row_ptr, row_ptr, 1, tl.program_id(0) * CHUNK, inv_temp, key, DRAW, SUM_S, SUM_R,
            CHUNK, VOCAB, BLOCK, False)
    # Every result is stored, so none of the pass is compiled away.
    tl.store(out_ptr, max_x + mass_s + mass_r + max_z)
    tl.store(out_ptr + 1, (arg_x + arg_z + nan).to(tl.float32))
    tl.store(out_ptr + 2 + tl.arange(0, BLOCK), lane_x + lane_r)


def _tools() -> Path:
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def disassemble(dtype: str, draw: bool, sum_s: bool, sum_r: bool, tmp: str) -> str:
    """The variant's machine code for sm_90a (nvdisasm text)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = dict(DRAW=draw, SUM_S=sum_s, SUM_R=sum_r, CHUNK=CHUNK, VOCAB=VOCAB, BLOCK=SCAN_BLOCK_SIZE)
    sig = dict(row_ptr=f"*{dtype}", out_ptr="*fp32", inv_temp="fp32", key="u32",
               **{n: "constexpr" for n in consts})
    # The scan's logits pointer and row stride are specialised on 16-byte alignment, as a GPU
    # run would find them (a fresh tensor, a row stride of a multiple of 16 elements).
    aligned = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    compiled = triton.compile(ASTSource(fn=_stream_kernel, signature=sig, constexprs=consts,
                                        attrs=aligned),
                              target=GPUTarget("cuda", 90, 32), options=OPTIONS)
    return machine_code(compiled, tmp, "stream")


def machine_code(compiled, tmp: str, name: str) -> str:
    """The nvdisasm text of a Triton compile for sm_90a, assembled with the ptxas Triton ships
    (files `name`.ptx and .o under `tmp`)."""
    ptx = Path(tmp) / f"{name}.ptx"
    ptx.write_text(compiled.asm["ptx"])
    subprocess.run([str(_tools() / "ptxas"), "-arch=sm_90a", str(ptx), "-o", f"{ptx}.o"],
                   check=True, capture_output=True)
    return subprocess.run([str(_tools() / "nvdisasm"), "-c", f"{ptx}.o"], check=True,
                          capture_output=True, text=True).stdout


def instructions(sass: str) -> list[str]:
    """The machine instructions of the disassembly, without the trap loop at its end."""
    lines = [x for x in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", x)]
    while lines and re.search(r"\bBRA\b|\bNOP\b", lines[-1]):
        lines.pop()
    return lines


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest stretch from a label to a branch back to it: the
    streaming loop where ptxas kept one, else empty (the kernel's end holds a one-instruction
    trap loop)."""
    lines = sass.splitlines()
    labels = {line.split(":")[0]: i for i, line in enumerate(lines) if line.startswith(".L_x_")}
    spans = [(labels[m.group(1)], end) for end, line in enumerate(lines)
             for m in [re.search(r"BRA `\((\.L_x_\d+)\)", line)]
             if m and labels.get(m.group(1), end + 1) <= end]
    start, end = max(spans, key=lambda s: s[1] - s[0], default=(0, -1))
    body = instructions("\n".join(lines[start:end + 1]) + "\n")
    return body if len(body) > 8 else []


def opcode(line: str) -> str:
    return re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line).group(1)


def count(dtype: str, variant: str, tmp: str, dump: str | None = None) -> dict:
    """One variant's machine instructions: the loop per iteration where ptxas kept one, else
    the whole program (its few reductions and stores included) over a thread's share of the
    chunk; `per_element` divides by the elements that covers. `ex2_guards` counts the compares
    against -126 that ptxas wraps around an ex2.approx.f32 that may produce a denormal."""
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    sass = disassemble(short, *VARIANTS[variant], tmp)
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        (Path(dump) / f"{short}_{variant}.sass").write_text(sass)
    # A loop iteration streams two tiles of SCAN_BLOCK_SIZE lanes over the program's threads.
    body, elements, counted = loop_body(sass), 2 * SCAN_BLOCK_SIZE // THREADS, "loop"
    if not body:
        body, elements, counted = instructions(sass), CHUNK // THREADS, "program"
    ops = collections.Counter(opcode(x) for x in body)
    return dict(dtype=dtype, variant=variant, counted=counted, instructions=len(body),
                elements=elements, per_element=len(body) / elements,
                ex2_guards=sum("-126" in x for x in body),
                lg2=sum("MUFU.LG2" in x for x in body),
                **{op: ops[op] for op in ("MUFU", "FADD", "FMUL", "FSEL")})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--dump", default=None)
    parser.add_argument("--json", action="store_true", help="one JSON list on the last line")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [count(dtype, variant, tmp, args.dump) for dtype in args.dtypes.split(",")
                for variant in VARIANTS]
    if args.json:
        print(json.dumps(rows))
        return
    print("| dtype | variant | counted | instructions | per element | MUFU | FADD | FMUL | FSEL |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['dtype']} | {r['variant']} | {r['counted']} | {r['instructions']} | "
              f"{r['per_element']:.1f} | {r['MUFU']} | {r['FADD']} | {r['FMUL']} | {r['FSEL']} |")


if __name__ == "__main__":
    main()
