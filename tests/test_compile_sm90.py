"""The sampler, plan and p2p kernels (with the divergence check) compile for sm_90 (H100/H200) on
a machine without a GPU.

The CPU suite runs kernels under the Triton interpreter, which accepts code the compiler
rejects (a name rebound to another type, a non-constexpr global) and says nothing about
registers. This test compiles the kernels the way a GPU run would (the sampler's logits and
buffers specialised on 16-byte alignment), in a child process without TRITON_INTERPRET (the
interpreter replaces `@triton.jit` at import), and checks with the ptxas Triton ships that the
streaming scan never spills, with one chunk per program and with two (a large batch's; a
logprob row's pass, `rows.sum_chunk`, is unrolled in both), and that its variant without
bitmask support fits the launcher's register cap (four programs of 8 warps per SM) with the
launcher's options.

A faster check runs first: every kernel's cache key, which a GPU launch computes before it
compiles, and which refuses calls the interpreter accepts (a plain Python function called from a
kernel or a `@triton.constexpr_function`).

Run alone: `python -m tests.test_compile_sm90` prints each kernel's registers, spills, shared
memory and machine code bytes for the variants a GPU run launches (`REPORTED`; with `--tested
scans` or `--tested finish`, a part of the test's), so a kernel change can be weighed on a CPU
before a GPU times it.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from graphshard.sample.grid import LEAN_SCAN_REGISTERS

ROOT = Path(__file__).resolve().parents[1]
# The sampler's arguments a GPU launch specialises on 16-byte alignment (`_compile`).
ALIGNED = ("logits", "buffers")
# The sampler variants compiled: (vocab, dtype, M, K, bitmask, the finish's programs per row,
# the sampler kernels compiled). The report's are two a GPU run launches: a small batch's at
# 152064 fp32, whose finish splits a row over programs, and a drafted 32000 bf16 batch with a
# grammar bitmask, whose finish does not.
BOTH = ("scan", "finish")
REPORTED = ((152064, "fp32", 1, 20, False, 16, BOTH), (32000, "bf16", 3, 3, True, 1, BOTH))
# The test's, in two parts the suite's workers run side by side, each (sampler variants, whether
# the other kernels are compiled too): the same scans with every other kernel, and one finish
# with every optional branch on (drafts, bitmask, logprobs, a row split over programs). A
# finish is most of the compile time (~150-225 s on the 2-core CI machine) and the branches are
# independent constexprs: one variant covers what the report's two cover.
TESTED = {
    "scans": (((152064, "fp32", 1, 20, False, 16, ("scan",)),
               (32000, "bf16", 3, 3, True, 16, ("scan",))), True),
    "finish": (((32000, "bf16", 3, 3, True, 16, ("finish",)),), False),
}


def _ptxas() -> Path | None:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return path if path.exists() else None


def _compile(kernel, args: dict, consts: dict, num_warps: int, tmp: str, aligned=(),
             **options) -> dict:
    """`aligned`: arguments (a tuple's every element) that a GPU launch finds divisible by 16,
    as the sampler's logits pointer and row stride and its buffers are: specialised on it, the
    kernel loads 16 bytes at a time, and its registers are those a GPU run compiles."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = inspect.signature(kernel.fn).parameters
    consts = {n: v for n, v in consts.items() if n in names}
    # A tuple argument's type is a tuple (or the same NamedTuple) of its elements' types.
    sig = {n: ("constexpr" if n in consts else args[n]) for n in names}
    attrs = {}
    for i, n in enumerate(names):
        if n in aligned:
            paths = [(i, j) for j in range(len(args[n]))] if isinstance(args[n], tuple) else [(i,)]
            attrs.update({path: [["tt.divisibility", 16]] for path in paths})
    ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, **options))
    ptx = Path(tmp) / f"{kernel.fn.__name__}.ptx"
    ptx.write_text(ck.asm["ptx"])
    out = subprocess.run([str(_ptxas()), "-arch=sm_90a", "-v", str(ptx), "-o", str(ptx) + ".o"],
                         capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", out))
    return {"kernel": kernel.fn.__name__, "registers": regs, "spill_bytes": spills,
            "shared_bytes": ck.metadata.shared,
            "code_bytes": _code_bytes(Path(str(ptx) + ".o"), kernel.fn.__name__)}


def _code_bytes(cubin: Path, name: str) -> int:
    """Size of the kernel's machine code: its `.text.<name>` section in the ELF that ptxas wrote
    (64-bit little-endian section headers)."""
    elf = cubin.read_bytes()
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    header = lambda i: struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)  # noqa: E731
    names_at = header(shstrndx)[4]
    for i in range(shnum):
        name_at, *_, size = header(i)
        start = names_at + name_at
        if elf[start:elf.index(b"\0", start)] == f".text.{name}".encode():
            return size
    raise ValueError(f"no .text.{name} section in {cubin}")


def report(sampler_variants=REPORTED, others: bool = True) -> list[dict]:
    """Compile the sampler's `sampler_variants` and (`others`) every other kernel; one dict per
    kernel variant."""
    from graphshard.sample import grid, kernels as sampler
    from graphshard.plan.kernel import _plan_kernel
    from graphshard.plan.layout import PlanBuffers
    from graphshard.sample.workspace import CHUNK_SIZE, pool_size_for

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab, dtype, m, k, bitmask, programs, kernels in sampler_variants:
            splits = -(-vocab // CHUNK_SIZE)
            finish = dict(PROGRAMS=grid.finish_programs(
                1, splits, pool_size_for(splits, vocab, None), vocab, programs))
            i32 = "*i32"
            common = dict(logits=(f"*{dtype}", "i32"), num_reqs_ptr=i32, req_slots_ptr=i32,
                          cu_num_logits_ptr=i32, seq_lens_ptr=i32, buffers=(i32, i32),
                          rows="i32", records=(i32, "i32"), bitmask_stride="i32")
            # Absent optional inputs are None: constexprs.
            optional = dict(mask=sampler.Bitmask(i32, i32) if bitmask else None,
                            bitmask_on_ptr=i32 if bitmask else None,
                            draft_ptr=i32 if m > 1 else None)
            common.update({n: t for n, t in optional.items() if t is not None})
            shared = dict({n: None for n, t in optional.items() if t is None}, VOCAB=vocab, M=m,
                          K=k, SPLITS=splits, CAP=pool_size_for(splits, vocab, None),
                          BLOCK=grid.SCAN_BLOCK_SIZE, PDL=False)
            tag = {"vocab": vocab, "dtype": dtype, "M": m, "K": k, "bitmask": bitmask}
            options = grid.scan_options(bitmask, grid.SCAN_BLOCK_SIZE)
            num_warps = options.pop("num_warps")
            # (chunks per scan program, the finish's programs per row) of this batch; without a
            # bitmask also a large batch's (two chunks per program).
            groups = [(1, finish["PROGRAMS"])] + ([] if bitmask else [(2, 1)])
            for group, programs in groups if "scan" in kernels else ():
                rows.append(dict(tag, group=group, **_compile(
                    sampler._scan_kernel, common,
                    dict(shared, CHUNK=CHUNK_SIZE, GROUP=group,
                         NUCLEUS_WINNER=sampler.nucleus_winner(programs)),
                    num_warps, tmp, ALIGNED, **options)))
            if "finish" not in kernels:
                continue
            # A small batch's finish options (no register cap).
            options = grid.finish_options(1, finish["PROGRAMS"], grid.SCAN_BLOCK_SIZE)
            finish["COUNT_TILES"] = grid.count_tiles(options)
            num_warps = options.pop("num_warps")
            rows.append(dict(tag, **_compile(
                sampler._finish_kernel, common, dict(shared, SMALL_BLOCK=512, **finish), num_warps,
                tmp, ALIGNED, **options)))
        if not others:
            return rows
        plan_args = {n: "*i32" for n in inspect.signature(_plan_kernel.fn).parameters}
        plan_args.update(plan=PlanBuffers(*["*i32"] * len(PlanBuffers._fields)),
                         max_num_reqs="i32", max_num_rows="i32", gather_stride="i32")
        rows.append(_compile(_plan_kernel, plan_args,
                             dict(TP_SIZE=2, TP_RANK=1, PADDED_NUM_REQS=1024,
                                  PADDED_NUM_LOGITS_PER_REQ=4, HAS_DRAFTS=True), 8, tmp))
        rows += _divergence_kernels(tmp)
        rows += _publish_kernels(tmp)
        rows += _fetch_kernels(tmp)
    return rows


def _fetch_kernels(tmp: str) -> list[dict]:
    """The tp = 1 step's first kernel (the interpreter accepts calls that the compiler refuses,
    such as a jit function's string constexpr left to its default)."""
    from graphshard.plan.staging import _fetch_kernel

    signature = dict(rows_ptr="*i32", meta_ptr="*i32", last_ptr="*i64", max_num_reqs="i32")
    return [_compile(_fetch_kernel, signature, dict(BLOCK=1024, LAUNCH_DEPENDENTS=pdl), 4, tmp)
            for pdl in (False, True)]


def _publish_kernels(tmp: str) -> list[dict]:
    """The tp = 1 step's last kernel, with one program and with an arrival over several."""
    from graphshard.engine.readout import _publish_kernel

    args = {n: "*i64" for n in inspect.signature(_publish_kernel.fn).parameters}
    args.update(records_ptr="*i32", tokens_ptr="*i32", num_reqs_ptr="*i32", arrivals_ptr="*i32")
    return [dict(_compile(_publish_kernel, args, dict(WIDTH=46, TOKENS=1, SLOT=47104, BLOCK=1024,
                                                      SHARED=shared, PDL=False), 4, tmp),
                 shared=shared)
            for shared in (False, True)]


def _divergence_kernels(tmp: str) -> list[dict]:
    """The p2p pushes with the divergence check on, and the padded transports' seal and judge."""
    from graphshard.transports.digest import _judge_kernel, _seal_kernel
    from graphshard.transports.p2p import _push_records_kernel, _push_rows_kernel

    def args(kernel, consts, **types):
        names = inspect.signature(kernel.fn).parameters
        return {n: types.get(n, "*i64") for n in names if n not in consts}

    world = dict(WORLD_SIZE=2)
    rows_c = dict(world, VOCAB_SHARD=76032, MAX_BLOCKS=256, CHANNEL=0, ALL_ROWS=False, FENCE=False,
                  AGREE=True, BLOCK=4096)
    records_c = dict(world, WIDTH=4, REQ_TILE=32, MAX_BLOCKS=256, CHANNEL=2, FENCE_BEFORE=False,
                     DONE=True, AGREE=True)
    judge_c = dict(world, DONE=True)  # judges, then ends the step
    i32 = "*i32"
    return [
        _compile(_seal_kernel, args(_seal_kernel, {}, out_ptr=i32, max_num_reqs="i32"), {}, 4,
                 tmp),
        _compile(_judge_kernel, args(_judge_kernel, judge_c, digests_ptr=i32, rank_stride="i32"),
                 judge_c, 1, tmp),
        _compile(_push_rows_kernel, args(
            _push_rows_kernel, rows_c, src=("*fp32", "i32"), send_rows_ptr=i32,
            row_offsets_ptr=i32, num_rows="i32", status_ptr=i32, digest=("*i64", "i32", "*i64"),
            rank="i32", timeout_ns="i64"),
            rows_c, 8, tmp),
        _compile(_push_records_kernel, args(
            _push_records_kernel, records_c, records=(i32, "i32"), local_num_reqs_ptr=i32,
            local_req_indices_ptr=i32, status_ptr=i32, arrivals_ptr=i32,
            done=("*i64", "*i64", "*i64"), verdict=("*i64", "*i64"), rank="i32",
            timeout_ns="i64"), records_c, 4, tmp),
    ]


def cache_keys() -> dict[str, str]:
    """Every kernel's cache key, which a GPU launch computes first: it walks the kernel and the
    helpers it calls, and refuses a plain Python function where only `@triton.jit` and
    `@triton.constexpr_function` ones may be called (the interpreter runs either)."""
    import importlib
    import pkgutil

    import triton

    import graphshard

    keys = {}
    for info in pkgutil.walk_packages(graphshard.__path__, "graphshard."):
        if info.name.endswith(".__main__"):  # the command line, which runs when imported
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, triton.runtime.JITFunction) and name.endswith("_kernel") \
                    and value.fn.__module__ == info.name:
                keys[f"{info.name}.{name}"] = value.cache_key
    return keys


def test_every_kernel_has_a_cache_key_outside_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="0")
    done = subprocess.run([sys.executable, "-m", "tests.test_compile_sm90", "--keys"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    keys = json.loads(done.stdout.splitlines()[-1])
    assert {"graphshard.sample.kernels._scan_kernel", "graphshard.sample.kernels._finish_kernel",
            "graphshard.plan.kernel._plan_kernel"} <= set(keys), sorted(keys)


@pytest.mark.skipif(_ptxas() is None, reason="this Triton build ships no NVIDIA ptxas")
@pytest.mark.parametrize("part, kernels", [
    ("scans", {"_scan_kernel", "_plan_kernel", "_seal_kernel", "_judge_kernel",
               "_push_rows_kernel", "_push_records_kernel", "_publish_kernel", "_fetch_kernel"}),
    ("finish", {"_finish_kernel"}),
], ids=["scans", "finish"])
def test_kernels_compile_for_sm90_and_the_scan_does_not_spill(part, kernels):
    # Compiled, not interpreted: an explicit 0 also keeps graphshard from choosing the interpreter.
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="graphshard-sm90-")
    # A finish variant takes ~225 s on a 2-core machine; three quarters of it is one Triton
    # pass, TritonGPUCoalesce (MLIR_ENABLE_TIMING=1), on a 19000-line TTIR with 99 tensor loads
    # and stores: its time grows with the kernel's size. So the test compiles one (TESTED).
    done = subprocess.run([sys.executable, "-m", "tests.test_compile_sm90", "--json", "--tested",
                           part], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(done.stdout.splitlines()[-1])
    assert {r["kernel"] for r in rows} == kernels
    for r in rows:
        assert r["spill_bytes"] == 0 or r["kernel"] != "_scan_kernel", r
        if r["kernel"] == "_scan_kernel" and not r["bitmask"]:
            assert r["registers"] <= LEAN_SCAN_REGISTERS, r


if __name__ == "__main__":
    if "--keys" in sys.argv:
        print(json.dumps(cache_keys()))
        sys.exit()
    if "--tested" in sys.argv:
        result = report(*TESTED[sys.argv[sys.argv.index("--tested") + 1]])
    else:
        result = report(REPORTED)
    if "--json" in sys.argv:
        print(json.dumps(result))
    else:
        for r in result:
            print(r)
