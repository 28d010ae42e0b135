"""`deferred_launches` records launches without running them, and `compile_launches` compiles
their variants on a thread pool into the kernels' in-memory caches, keyed as the launches'
own compiles would be.

Compiled for sm_90 with no GPU (`benchmarks.prebuild.CompileOnlyDriver`), in child processes
with TRITON_INTERPRET=0 (importing graphshard without CUDA turns the interpreter on)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from graphshard.runtime.launch import compile_launches, deferred_launches, launch, recorded

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys, threading
    from typing import NamedTuple
    import torch, triton, triton.compiler, triton.language as tl
    from triton import knobs
    from benchmarks.prebuild import CompileOnlyDriver
    from graphshard.runtime.launch import compile_launches, deferred_launches, launch

    threads = []
    real_compile = triton.compiler.compile

    def spy(*args, **kwargs):  # a kernel takes `compile` from here at its first launch
        threads.append(threading.current_thread().name)
        return real_compile(*args, **kwargs)

    triton.compiler.compile = spy
    FACTOR = tl.constexpr(2.0)

    @triton.jit
    def _times(x):
        return x * FACTOR

    @triton.jit
    def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, _times(tl.load(x_ptr + i, mask=i < n)), mask=i < n)

    class Buf(NamedTuple):
        x: torch.Tensor

    @triton.jit
    def _shift_kernel(buf, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(buf.x + i, _times(tl.load(buf.x + i, mask=i < n)) + 1.0, mask=i < n)

    triton.runtime.driver.set_active(CompileOnlyDriver(90))
    x = torch.ones(64)
    # n = 64 and 48 share a variant (divisible by 16), 63 does not; BLOCK 128 is another. Both
    # kernels call one helper, so each one's cache key depends on whether the other's is known.
    launches = [(k, a, n, b) for n, b in ((64, 64), (48, 64), (63, 64), (64, 128))
                for k, a in ((_scale_kernel, x), (_shift_kernel, Buf(x)))]
    if sys.argv[1] == "ahead":
        with deferred_launches() as recorded:
            for k, a, n, b in launches:
                assert launch(k, (1,), a, n, BLOCK=b) is None
        variants = compile_launches(recorded, workers=3)
        compiles = len(threads)
        again = compile_launches(recorded, workers=3)
        misses = []
        knobs.runtime.jit_cache_hook = lambda **kw: misses.append(kw["fn"].name) or True
        for k, a, n, b in launches:  # what a launch looks up first: the kernel's own cache
            k.warmup(a, n, BLOCK=b, grid=(1,))
        json.dump({"recorded": len(recorded), "variants": variants, "compiles": compiles,
                   "again": again, "misses": misses, "untouched": bool((x == 1).all()),
                   "pool": sorted(set(t.split("_")[0] for t in threads))}, sys.stdout)
    elif sys.argv[1] == "fail":  # one variant fails to compile
        from triton.runtime import _async_compile

        @triton.jit
        def _broken_kernel(x_ptr, BLOCK: tl.constexpr):
            tl.static_assert(BLOCK < 64, "BLOCK too large")
            tl.store(x_ptr + tl.arange(0, BLOCK), 0.0)

        with deferred_launches() as recorded:
            launch(_scale_kernel, (1,), x, 64, BLOCK=64)
            launch(_broken_kernel, (1,), x, BLOCK=64)
            launch(_shift_kernel, (1,), Buf(x), 64, BLOCK=64)
        try:
            compile_launches(recorded, workers=2)
            error = None
        except Exception as e:
            error = str(e)
        left_active = _async_compile.active_mode.get() is not None
        misses = []
        knobs.runtime.jit_cache_hook = lambda **kw: misses.append(kw["fn"].name) or True
        _scale_kernel.warmup(x, 64, BLOCK=64, grid=(1,))
        _shift_kernel.warmup(Buf(x), 64, BLOCK=64, grid=(1,))
        knobs.runtime.jit_cache_hook = None
        with deferred_launches() as later:  # the thread still compiles
            launch(_scale_kernel, (1,), x, 63, BLOCK=64)
        json.dump({"error": error, "left_active": left_active, "misses": misses,
                   "later": compile_launches(later, workers=2)}, sys.stdout)
    else:  # what launches compile, one after another
        for k, a, n, b in launches:
            k.warmup(a, n, BLOCK=b, grid=(1,))
        json.dump({"compiles": len(threads)}, sys.stdout)
''')


def _run(tmp_path: Path, cache: Path, how: str) -> dict:
    script = tmp_path / "ahead.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script), how], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_recorded_launches_compile_on_the_pool_as_the_launches_would(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    ahead = _run(tmp_path, tmp_path / "ahead", "ahead")
    assert ahead == {"recorded": 8, "variants": 6, "compiles": 6, "again": 0, "misses": [],
                     "untouched": True, "pool": ["graphshard-compile"]}
    launched = tmp_path / "launched"
    assert _run(tmp_path, launched, "launch") == {"compiles": 6}
    # The same cache entries, keys included, as the launches' own compiles in their order.
    assert {d.name for d in (tmp_path / "ahead").iterdir()} == {d.name for d in launched.iterdir()}


def test_a_failed_compile_raises_after_the_others_are_in_memory_and_leaves_no_mode(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    got = _run(tmp_path, tmp_path / "cache", "fail")
    assert "BLOCK too large" in got.pop("error")
    assert got == {"left_active": False, "misses": [], "later": 1}


def test_deferred_launches_run_nothing_and_do_not_nest():
    x = torch.zeros(4)
    calls = []

    class Kernel:  # anything launch() would index and call
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    kernel = Kernel()
    with deferred_launches() as recorded:
        launch(kernel, (2,), x, 4, BLOCK=8)
        with pytest.raises(RuntimeError, match="already active"):
            with deferred_launches():
                pass
    assert calls == [] and len(recorded) == 1
    assert recorded[0].grid == (2,) and recorded[0].args[0] is x and recorded[0].kwargs == {"BLOCK": 8}
    launch(kernel, (1,), x)  # after the block, launches run again
    assert calls == [((1,), (x,), {})]
    assert compile_launches(recorded) == 0  # nothing there is a compiled Triton kernel


def test_a_recorded_function_runs_once_and_its_launches_replay():
    x = torch.zeros(4)
    ran, calls = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    kernel = Kernel()

    def fn():
        ran.append(1)
        launch(kernel, (2,), x, 4, BLOCK=8)
        launch(kernel, (3, 1), x, BLOCK=16)

    want = [((2,), (x, 4), {"BLOCK": 8}), ((3, 1), (x,), {"BLOCK": 16})]
    call = recorded(fn)
    for _ in range(3):
        call()
    assert len(ran) == 1  # once, recording; then only its launches
    assert calls == want * 3 and calls[0][1][0] is x
    # Recorded first by the compile-ahead (fn itself, nothing run), its launches are kept: its
    # first call outside replays them.
    ran.clear(), calls.clear()
    call = recorded(fn)
    with deferred_launches() as outer:
        launch(kernel, (9,), x)  # another function's launch, recorded before it
        call()
    assert len(ran) == 1 and len(outer) == 3 and calls == []
    with deferred_launches() as again:
        call()
    assert len(ran) == 2 and len(again) == 2
    for _ in range(2):
        call()
    assert len(ran) == 2 and calls == want * 2


def test_a_recorded_function_that_fails_records_nothing():
    def fn():
        raise ValueError("bad argument")

    call = recorded(fn)
    for _ in range(2):
        with pytest.raises(ValueError, match="bad argument"):
            call()
