"""examples/decode_loop.py runs as a user runs it: tp = 1 and tp = 2 give the same tokens."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_decode_loop_example_gives_the_same_tokens_at_tp_1_and_2():
    # --baseline: the all-gather + PyTorch sampler loop runs too (it is timed only on GPUs).
    result = subprocess.run([sys.executable, "examples/decode_loop.py", "--tp", "2", "--baseline"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600,
                            # This checkout's graphshard, whichever one the environment installed.
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tp=2 gives the same tokens as tp=1: True; the same logprobs: True" in result.stdout
    assert "all-gather + PyTorch sampler" in result.stdout
    for tp in (1, 2):
        assert f"tp={tp}: " in result.stdout and "tokens/s" in result.stdout
