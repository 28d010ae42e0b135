"""The capture after the scan's stream stays cheap for rows that need a few candidates (no CPU
suite runs the compiled code: the interpreter says nothing about instructions).

A program of a greedy + logprobs row from batch 256 up lists a few hot lanes and reads them back
(BENCHMARKS.md, "The capture step after the stream"). Listed through a prefix sum over all 1024
lanes, which moves them between threads through shared memory, with the 256-lane tile always,
that step cost 946 machine instructions per thread next to a stream of ~1020; through a prefix
sum over threads, in a tile sized to the hot lanes, 199. This test compiles each step with the
ptxas Triton ships, as `python -m benchmarks.capture_sass` does, and fails if the listing's
cost comes back or the tiles stop growing with their width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_compile_sm90 import _ptxas

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(_ptxas() is None, reason="this Triton build ships no NVIDIA ptxas")
def test_few_hot_lanes_are_listed_and_read_back_cheaply():
    # Compiled, not interpreted: an explicit 0 also keeps graphshard from choosing the interpreter.
    env = dict(os.environ, TRITON_INTERPRET="0",
               TRITON_CACHE_DIR=tempfile.mkdtemp(prefix="graphshard-sass-"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.capture_sass", "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    cost = {r["path"]: r["instructions"] for r in json.loads(done.stdout.splitlines()[-1])}
    # The old listing cost 338 with the 32-lane tile (946 with the 256-lane one it always used).
    assert cost["list_32"] < 260, cost
    assert cost["list_32"] < cost["list_128"] < cost["list_256"], cost
    # A radix pass over 256 folded maxima costs less than one over all 1024 lanes.
    assert cost["radix_small"] < cost["radix"], cost
