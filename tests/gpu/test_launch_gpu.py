"""On a GPU, a `bound` launch does what the plain launch does, call after call: its arguments
bound once (a tuple argument, a constexpr, a default, a launch option), the stream current at
each call, and into a CUDA graph that captures it."""

from typing import NamedTuple

import pytest
import torch
import triton
import triton.language as tl

from graphshard.runtime.launch import Launch, bound, compiles_kernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class _Pair(NamedTuple):
    src: torch.Tensor
    dst: torch.Tensor


@triton.jit
def _accumulate_kernel(pair, n, scale, BLOCK: tl.constexpr, OFFSET: tl.constexpr = 1.0):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    x = tl.load(pair.src + i, mask=live)
    tl.store(pair.dst + i, tl.load(pair.dst + i, mask=live) + x * scale + OFFSET, mask=live)


def test_bound_launches_equal_plain_ones_on_any_stream_and_in_a_graph():
    assert compiles_kernels(_accumulate_kernel)
    n = 5000
    src = torch.randn(n, device="cuda")
    plain, fast = torch.zeros(n, device="cuda"), torch.zeros(n, device="cuda")

    def item(dst):
        return Launch(_accumulate_kernel, (triton.cdiv(n, 1024),), (_Pair(src, dst), n, 0.5),
                      dict(BLOCK=1024, num_warps=4))

    thunk = bound(item(fast))
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side, torch.cuda.current_stream()):
        with torch.cuda.stream(stream):
            for _ in range(3):
                it = item(plain)
                _accumulate_kernel[it.grid](*it.args, **it.kwargs)
                thunk()
    torch.cuda.synchronize()
    assert torch.equal(plain, fast)
    assert torch.allclose(plain, 9 * (src * 0.5 + 1.0))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        thunk()
    before = fast.clone()
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(fast, before + 2 * (src * 0.5 + 1.0))
