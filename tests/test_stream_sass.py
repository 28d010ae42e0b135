"""The streaming pass's softmax sums compile to a bare MUFU.EX2 per element on sm_90 (no CPU
suite runs the compiled code: the interpreter takes `tl.exp`'s place there).

`rows.exp_neg` uses ex2.approx.ftz through inline PTX when compiled. Written with `tl.exp`,
each exp carries ptxas's guard for denormal results (a compare against -126 and two predicated
multiplies), 3 of the 13 instructions per element that a streaming sum cost on an H200
(BENCHMARKS.md). A logprob row's pass (`rows.sum_chunk`) takes one exp per element and one
per lane and step of tiles. This test compiles the stream with the ptxas Triton ships, as
`python -m benchmarks.stream_sass` does, and fails if a guard or a second exp comes back, or if
the Gumbel race of a random row takes its logs other than by the SFU (`rng._log2`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benchmarks.stream_sass import CHUNK, THREADS
from graphshard.sample.grid import SCAN_BLOCK_SIZE
from graphshard.sample.rows import SUM_STEP
from tests.test_compile_sm90 import _ptxas

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(_ptxas() is None, reason="this Triton build ships no NVIDIA ptxas")
def test_stream_sums_take_one_unguarded_exp_per_element():
    # Compiled, not interpreted: an explicit 0 also keeps graphshard from choosing the interpreter.
    env = dict(os.environ, TRITON_INTERPRET="0",
               TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="graphshard-sass-"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.stream_sass", "--dtypes",
                           "float32,bfloat16", "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = {(r["dtype"], r["variant"]): r for r in json.loads(done.stdout.splitlines()[-1])}
    steps = CHUNK // (SUM_STEP * SCAN_BLOCK_SIZE)
    for dtype in ("float32", "bfloat16"):
        greedy = rows[dtype, "greedy"]
        assert greedy["MUFU"] == 0 and greedy["ex2_guards"] == 0, greedy
        # A logprob row's pass, counted whole (unrolled): one exp per element and one per lane
        # and step (its sum rescaled), unguarded; guarded only the one per lane of the chunk's
        # final combine (`rows._lanes_mass`, tl.exp). Four lanes per thread, every tile of a
        # lane in its thread.
        first_try = rows[dtype, "sum_r"]
        lanes = SCAN_BLOCK_SIZE // THREADS
        assert first_try["counted"] == "program" and first_try["ex2_guards"] == lanes, first_try
        assert first_try["MUFU"] == first_try["elements"] + lanes * (steps + 1), first_try
        for variant, sums in (("sum_s", 1), ("both", 2)):
            r = rows[dtype, variant]
            assert r["ex2_guards"] == 0, r
            assert r["MUFU"] == sums * r["elements"], r
        # The Gumbel race: two SFU logs per element and no exp, not libdevice's logf (~20
        # FMA-pipe instructions each, no MUFU).
        draw = rows[dtype, "draw"]
        assert draw["lg2"] == 2 * draw["elements"] == draw["MUFU"], draw
        # A small-batch top-p-only row's race and score sum: the two logs and one exp.
        both = rows[dtype, "draw_sum_s"]
        assert both["ex2_guards"] == 0, both
        assert both["lg2"] == 2 * both["elements"] and both["MUFU"] == 3 * both["elements"], both
