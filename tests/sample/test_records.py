"""The record split: host copies (`HostOutput`, fields split off when read) against the device
views (`SamplerOutput`), field by field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graphshard.sample.records import FIELDS, RecordLayout, unpack, unpack_host


def _records(n: int, layout: RecordLayout, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    records = rng.integers(-2**31, 2**31 - 1, size=(n, layout.width), dtype=np.int64)
    records = records.astype(np.int32)
    m = layout.max_num_logits_per_req
    records[:, layout.num_sampled] = rng.integers(1, m + 1, size=n)  # as the sampler writes it
    return records


@pytest.mark.parametrize("m,k", [(1, 0), (3, 0), (1, 5), (2, 4)])
def test_host_fields_equal_the_device_views(m, k):
    layout = RecordLayout(m, k)
    records = _records(7, layout)
    host = unpack_host(records, layout)
    device = unpack(torch.from_numpy(records.copy()), layout)
    for name in FIELDS:
        got, want = getattr(host, name), getattr(device, name)
        if want is None:
            assert got is None and k == 0, name
            continue
        assert got.dtype == want.numpy().dtype and np.array_equal(got, want.numpy()), name
        assert np.shares_memory(got, records), name  # a view of the copy, not a copy
        assert getattr(host, name) is got, name  # split once, then kept
    for j in range(7):
        assert host.tokens(j) == host.sampled_token_ids[j, :host.num_sampled[j]].tolist()
    assert host.records is records and host.layout == layout


def test_unpack_host_refuses_records_of_another_layout():
    layout = RecordLayout(2, 4)
    records = _records(3, layout)
    with pytest.raises(ValueError, match=r"int32 \[n, 25\]"):
        unpack_host(records[:, :-1], layout)
    with pytest.raises(ValueError, match="int32"):
        unpack_host(records.astype(np.int64), layout)
    with pytest.raises(ValueError, match="int32"):
        unpack_host(records[0], layout)


def test_unpack_returns_a_token_block_in_place_of_the_strided_view():
    layout = RecordLayout(2, 3)
    records = torch.arange(5 * layout.width, dtype=torch.int32).view(5, layout.width)
    tokens = records[:, :2].contiguous()
    out = unpack(records, layout, tokens)
    assert out.sampled_token_ids is tokens and out.num_sampled.data_ptr() != tokens.data_ptr()
    assert not unpack(records, layout).sampled_token_ids.is_contiguous()
    for bad in (records[:4, :2].contiguous(), records[:, :3].contiguous(), records[:, :2],
                tokens.to(torch.int64)):
        with pytest.raises(ValueError, match="tokens must be"):
            unpack(records, layout, bad)
