"""`benchmarks.prebuild_engine` finds, on a CPU with the kernels compiled (no interpreter), the
sampler variants an engine's `capture()` compiles: its capture stops at that compile, having
launched nothing, with the capture's own keys. Child processes (TRITON_INTERPRET=0 must hold
before graphshard is imported); nothing is compiled here (a sampler variant takes minutes)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import json
    from benchmarks import prebuild_engine as pe
    from graphshard.config import Config
    from graphshard.engine.capture import fallback_keys, graph_keys
    import graphshard.runtime.launch as launch

    launched = []
    real = launch.launch
    launch.launch = lambda *a, **k: launched.append(a[0]) or real(*a, **k)
    cfg = Config(vocab_size=300, vocab_pad_multiple=8, max_num_reqs=12, max_num_logits_per_req=3,
                 max_num_slots=30, buckets=(1, 4, 8), num_logprobs=2, graph_backend="cuda")
    engine = pe.engine_as_on_gpu(cfg, 90)
    keys = pe.capture_keys(engine)
    launched_by_capture = len(launched)
    expected = graph_keys(cfg, engine._strategy, engine._tiers, False, engine.bitmask_free_graphs)
    expected += fallback_keys(cfg, engine._strategy, 1, False)
    found = pe.variants(pe.engine_as_on_gpu(cfg, 90))
    masks = {item.args[5] is None for item in found}  # a scan's or finish's bitmask argument
    print(json.dumps({
        "keys_equal": keys == expected, "captured": engine.captured, "launched": launched_by_capture,
        "recorded": len(launched) > launched_by_capture,
        "names": sorted({item.kernel.fn.__name__ for item in found}),
        "pdl": sorted({item.kwargs.get("PDL", False) for item in found}),
        "masks": sorted(masks), "count": len(found),
        "bitmask_free": engine.bitmask_free_graphs, "programmatic": engine.programmatic_launch}))
''')


def _child(args, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(ROOT))
    env.pop("TRITON_CACHE_DIR", None)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_capture_stops_at_its_compile_with_its_own_keys_and_launches_nothing(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    script = tmp_path / "find.py"
    script.write_text(SCRIPT)
    out = _child([str(script)], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["keys_equal"] and not got["captured"] and got["launched"] == 0
    assert got["recorded"]  # the counter sees launches: the variants' recording goes through it
    assert got["names"] == ["_finish_kernel", "_scan_kernel"]
    # As on an sm_90 GPU: programmatic launches, and graphs with and without bitmask support.
    assert got["programmatic"] and got["bitmask_free"] and got["pdl"] == [True]
    assert got["masks"] == [False, True]
    assert got["count"] >= 4


def test_list_follows_a_toml_config_and_refuses_the_interpreter(tmp_path):
    pytest.importorskip("triton.backends.nvidia")
    config = tmp_path / "small.toml"
    config.write_text(textwrap.dedent('''
        [engine]
        vocab_size = 250
        max_num_reqs = 6
        buckets = [1, 2]
        grammar_bitmask = false
        programmatic_launch = false
    '''))
    out = _child(["-m", "benchmarks.prebuild_engine", "--config", str(config), "--list"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    head = out.stdout.splitlines()[0]
    assert head.endswith("(programmatic launches: False, graphs without bitmask support: False)")
    assert int(head.split()[0]) >= 2 and "'PDL': True" not in out.stdout
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    refused = subprocess.run([sys.executable, "-m", "benchmarks.prebuild_engine", "--list"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "TRITON_INTERPRET=0" in refused.stderr
