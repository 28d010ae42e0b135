"""`benchmarks.prebuild` fills a Triton cache for sm_90 without a GPU, and the cache, pruned and
moved, still answers the same kernels without compiling them again.

Run in child processes with TRITON_INTERPRET=0 (else importing graphshard without CUDA turns
the interpreter on), on a small kernel so that it takes seconds; the sampler's own variants compile in
minutes (`python -m benchmarks.prebuild --help`)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from typing import NamedTuple
    import torch, triton, triton.language as tl
    from benchmarks import prebuild

    FACTOR = tl.constexpr(2.0)

    @triton.jit
    def _times(x):
        return x * FACTOR

    @triton.jit
    def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, _times(tl.load(x_ptr + i, mask=i < n)), mask=i < n)

    class Buf(NamedTuple):  # as the sampler's bitmask argument
        x: torch.Tensor

    @triton.jit
    def _shift_kernel(buf, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(buf.x + i, _times(tl.load(buf.x + i, mask=i < n)) + 1.0, mask=i < n)

    triton.runtime.driver.set_active(prebuild.CompileOnlyDriver(90))
    x = torch.ones(64)
    # n = 64 and 48 share a specialisation (divisible by 16), 63 does not; BLOCK 128 is another.
    # Both kernels call one helper, so each one's key depends on whether the other's is known.
    launches = [(k, a, n, b) for n, b in ((64, 64), (48, 64), (63, 64), (64, 128))
                for k, a in ((_scale_kernel, x), (_shift_kernel, Buf(x)))]
    if sys.argv[1] == "other":  # keyed for a machine whose Triton library is another file
        prebuild.key_for_library(Path(sys.argv[0]))
    if sys.argv[1] in ("fill", "other"):
        items = prebuild.collect([lambda k=k, a=a, n=n, b=b: k[(1,)](a, n, BLOCK=b)
                                  for k, a, n, b in launches], [_scale_kernel, _shift_kernel])
        prebuild.compile_all(items, len(items))  # a worker each: no worker saw another kernel
        json.dump({"items": len(items), "untouched": bool((x == 1).all())}, sys.stdout)
    else:  # what a GPU run's launches compile, one after another
        for k, a, n, b in launches:
            k.warmup(a, n, BLOCK=b, grid=(1,))
        json.dump({}, sys.stdout)
''')


def _run(tmp_path: Path, cache: Path, how: str = "fill") -> dict:
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script), how], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _files(cache: Path) -> set[str]:
    return {str(f.relative_to(cache)) for f in cache.rglob("*") if f.is_file()}


def test_cache_filled_as_launches_fill_it_pruned_and_moved_answers_without_compiling(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    from benchmarks.prebuild import relocate

    built = tmp_path / "built"
    assert _run(tmp_path, built) == {"items": 6, "untouched": True}
    assert any(f.endswith(".ptx") for f in _files(built))
    # The entries are those the launches themselves compile, in their order.
    launched = tmp_path / "launched"
    _run(tmp_path, launched, "warmup")
    assert {d.name for d in built.iterdir()} == {d.name for d in launched.iterdir()}
    other = tmp_path / "other"
    assert _run(tmp_path, other, "other")["items"] == 6
    assert not {d.name for d in other.iterdir()} & {d.name for d in built.iterdir()}
    entries, _ = relocate(built)
    assert entries == 6
    moved = tmp_path / "moved"
    shutil.move(built, moved)
    assert relocate(moved)[0] == 6
    pruned = _files(moved)
    assert pruned and all(f.endswith((".json", ".cubin")) for f in pruned)
    for group in moved.glob("*/__grp__*.json"):
        paths = json.loads(group.read_text())["child_paths"].values()
        assert all(Path(p).parent == group.parent for p in paths)
    # A compile that missed the cache would write its intermediate files (.ptx, ...) again.
    assert _run(tmp_path, moved)["items"] == 6
    assert _files(moved) == pruned
