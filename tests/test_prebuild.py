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
    import torch, triton, triton.language as tl
    from benchmarks import prebuild

    @triton.jit
    def _scale_kernel(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2.0, mask=i < n)

    triton.runtime.driver.set_active(prebuild.CompileOnlyDriver(90))
    x = torch.ones(64)
    # n = 64 and 48 share a specialisation (divisible by 16), 63 does not; BLOCK 128 is another.
    calls = [lambda n=n, b=b: _scale_kernel[(1,)](x, n, BLOCK=b)
             for n, b in ((64, 64), (48, 64), (63, 64), (64, 128))]
    items = prebuild.collect(calls)
    prebuild.compile_all(items, 2)
    json.dump({"items": len(items), "untouched": bool((x == 1).all())}, sys.stdout)
''')


def _run(tmp_path: Path, cache: Path) -> dict:
    script = tmp_path / "fill.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def _files(cache: Path) -> set[str]:
    return {str(f.relative_to(cache)) for f in cache.rglob("*") if f.is_file()}


def test_cache_filled_pruned_and_moved_answers_without_compiling(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    from benchmarks.prebuild import relocate

    built = tmp_path / "built"
    assert _run(tmp_path, built) == {"items": 3, "untouched": True}
    assert any(f.endswith(".ptx") for f in _files(built))
    entries, _ = relocate(built)
    assert entries == 3
    moved = tmp_path / "moved"
    shutil.move(built, moved)
    assert relocate(moved)[0] == 3
    pruned = _files(moved)
    assert pruned and all(f.endswith((".json", ".cubin")) for f in pruned)
    for group in moved.glob("*/__grp__*.json"):
        paths = json.loads(group.read_text())["child_paths"].values()
        assert all(Path(p).parent == group.parent for p in paths)
    # A compile that missed the cache would write its intermediate files (.ptx, ...) again.
    assert _run(tmp_path, moved)["items"] == 3
    assert _files(moved) == pruned
