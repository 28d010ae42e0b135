"""`Staging.pull` through a byte copier (`runtime.memcpy.host_copier`, the CUDA path) copies
what `copy_` copies, the leading bytes its bucket uses, and falls back to `copy_` where the
driver refuses. On CPU the driver's copy is stood in for by `ctypes.memmove`."""

import ctypes

import numpy as np
import pytest
import torch

from graphshard.plan.staging import Staging

MAX = 24


def _staging(copier) -> Staging:
    staging = Staging(MAX, torch.device("cpu"))
    assert staging._copier is None  # no driver off CUDA
    staging._copier = copier
    return staging


def _memmove(dst, src, nbytes):
    ctypes.memmove(dst, src, nbytes)
    return True


@pytest.mark.parametrize("max_reqs", [None, 0, 1, 5, MAX])
@pytest.mark.parametrize("copier", ["memmove", "refused", None])
def test_pull_copies_the_leading_words_of_its_bucket(max_reqs, copier):
    calls = []

    def refused(dst, src, nbytes):
        calls.append(nbytes)
        return False

    staging = _staging({"memmove": _memmove, "refused": refused, None: None}[copier])
    reference = _staging(None)
    rng = np.random.default_rng(3)
    for s in (staging, reference):
        s.copies.fill_(-7)
    for step in range(3):
        words = rng.integers(-2**31, 2**31 - 1, staging.rows.shape[0], dtype=np.int32)
        staging.rows.numpy()[:] = words
        reference.rows.numpy()[:] = words
        staging.pull(max_reqs)
        reference.pull(max_reqs)
        assert torch.equal(staging.copies, reference.copies)
    used = staging._pulls[max_reqs][2] // 4
    assert torch.equal(staging.copies[:used], staging.rows[:used])
    assert bool((staging.copies[used:] == -7).all())
    if copier == "refused":
        assert calls == [4 * used] * 3
