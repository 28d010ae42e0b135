"""`StepInputs.write_tensors` through a byte copier (`runtime.memcpy`, the CUDA path) writes what
`copy_` writes, for every shape of input it may get: contiguous or strided logits and drafts,
a bitmask as wide as the buffer or as the real vocabulary, drafts that stop, empty steps. On
CPU the driver's copy is stood in for by `ctypes.memmove` over the tensors' host bytes."""

import ctypes

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphshard.engine.inputs import StepInputs
from graphshard.runtime.memcpy import DeviceCopier, device_copier

N, M, V = 6, 3, 40  # requests, rows a request, vocab shard
WORDS, REAL_WORDS = 2, 1


def _inputs(copier: bool) -> StepInputs:
    inputs = StepInputs(max_num_reqs=N, max_num_logits_per_req=M, vocab_shard=V,
                        bitmask_words=WORDS, real_bitmask_words=REAL_WORDS,
                        logits_dtype=torch.bfloat16, device=torch.device("cpu"))
    assert inputs._copier is None  # no driver off CUDA
    if copier:
        inputs._copier = lambda dst, src, nbytes: bool(ctypes.memmove(dst, src, nbytes) or True)
    return inputs


def _state(inputs: StepInputs) -> tuple[torch.Tensor, ...]:
    return (inputs.logits.clone(), inputs.draft_token_ids.clone(), inputs.grammar_bitmask.clone(),
            torch.tensor(inputs._dirty_draft_rows))


@st.composite
def _steps(draw):
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        rows = draw(st.integers(0, N * M))
        seed = draw(st.integers(0, 2**16))
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(rows, V + 8 if draw(st.booleans()) else V, generator=g)
        logits = logits[:, :V].to(torch.bfloat16)  # strided when the rows were wider
        drafts = None
        if draw(st.booleans()):
            drafts = torch.randint(0, V, (rows, 2), generator=g, dtype=torch.int32)
            drafts = drafts[:, 0] if draw(st.booleans()) else drafts[:, 0].contiguous()
        bitmask = None
        if draw(st.booleans()):
            width = draw(st.sampled_from((WORDS, REAL_WORDS)))
            bitmask = torch.randint(-2**31, 2**31 - 1, (rows, width), generator=g, dtype=torch.int32)
        steps.append((logits, drafts, bitmask, rows))
    return steps


@settings(max_examples=60, deadline=None)
@given(_steps())
def test_the_byte_copies_write_what_copy_writes(steps):
    fast, slow = _inputs(copier=True), _inputs(copier=False)
    for logits, drafts, bitmask, rows in steps:
        for inputs in (fast, slow):
            inputs.write_tensors(logits, drafts, bitmask, rows)
        for a, b in zip(_state(fast), _state(slow)):
            assert torch.equal(a, b)


def test_the_zero_copy_logits_are_not_copied():
    inputs = _inputs(copier=True)
    copies = []
    inputs._copier = lambda dst, src, nbytes: copies.append((dst, src, nbytes))
    inputs.write_tensors(inputs.logits[:4], None, None, 4)
    assert copies == []
    inputs.write_tensors(None, None, None, 4)
    assert copies == []


def test_the_driver_copier_reports_a_refusal_and_skips_empty_copies():
    calls = []

    def memcpy(dst, src, nbytes, stream):
        calls.append((dst, src, nbytes, stream))
        return 201 if nbytes == 3 else 0

    copier = DeviceCopier(torch.device("cuda", 0), memcpy)
    copier._stream = lambda: 7
    assert copier(16, 32, 0) and copier(16, 32, 8)
    assert calls == [(16, 32, 8, 7)] and copier.refused is None
    assert not copier(16, 32, 3) and copier.refused == 201


def test_a_refused_driver_copy_falls_back_to_copy_():
    fast, slow = _inputs(copier=True), _inputs(copier=False)
    fast._copier = lambda dst, src, nbytes: False  # the driver refuses every copy
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, V, generator=g).to(torch.bfloat16)
    drafts = torch.randint(0, V, (5,), generator=g, dtype=torch.int32)
    bitmask = torch.randint(0, 2**31 - 1, (5, WORDS), generator=g, dtype=torch.int32)
    for inputs in (fast, slow):
        inputs.write_tensors(logits, drafts, bitmask, 5)
    for a, b in zip(_state(fast), _state(slow)):
        assert torch.equal(a, b)


def test_no_driver_copier_off_cuda():
    assert device_copier(torch.device("cpu")) is None
