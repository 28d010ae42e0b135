"""`benchmarks.copy_cost`'s batched driver call, off the GPU: its attributes entry has the
driver's layout (`CUmemcpyAttributes`: 24 bytes, the location hints at 4 and 12, the flags at
20), and a call hands the driver the copies as filled, with one stream-ordered attributes entry
applying from the first copy on."""

import ctypes

import pytest
import torch

from benchmarks import copy_cost


def test_the_attributes_entry_has_the_drivers_layout():
    attrs = copy_cost.MemcpyAttributes
    assert ctypes.sizeof(attrs) == 24
    assert (attrs.srcLocHint.offset, attrs.dstLocHint.offset, attrs.flags.offset) == (4, 12, 20)


def test_a_call_hands_the_driver_the_copies_as_filled():
    seen = {}

    def fake_driver(dsts, srcs, sizes, count, attrs, attr_index, num_attrs, stream):
        entry = ctypes.cast(attrs, ctypes.POINTER(copy_cost.MemcpyAttributes)).contents
        seen.update(count=count, order=entry.srcAccessOrder, first=attr_index[0],
                    num_attrs=num_attrs, stream=stream)
        for i in range(count):
            ctypes.memmove(dsts[i], srcs[i], sizes[i])
        return 0

    batch = copy_cost.BatchCopy(torch.device("cpu"), fn=fake_driver, stream=lambda: 77)
    src = [torch.arange(n, dtype=torch.int32) * (k + 1) for k, n in enumerate((5, 9, 3))]
    dst = [torch.zeros_like(t) for t in src]
    for i, (d, s) in enumerate(zip(dst, src)):
        batch.dsts[i], batch.srcs[i], batch.sizes[i] = d.data_ptr(), s.data_ptr(), 4 * s.numel()
    assert batch.call(2) == 0
    assert seen == dict(count=2, order=copy_cost.SRC_ACCESS_ORDER_STREAM, first=0, num_attrs=1,
                        stream=77)
    assert torch.equal(dst[0], src[0]) and torch.equal(dst[1], src[1])
    assert not dst[2].any()  # past the count: not copied


def test_it_needs_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the refusal is for machines without one")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        copy_cost.main([])
