import numpy as np
import pytest
import torch

from graphshard.engine.validate import BatchLimits, InvalidBatchError, to_host_int32, validate_batch
from graphshard.errors import InvalidTypeError

LIMITS = BatchLimits(max_num_reqs=4, max_num_logits_per_req=3, max_num_slots=10)


def call(idx, cu, lens=None):
    lens = [5] * len(idx) if lens is None else lens
    return validate_batch(np.array(idx), np.array(cu), np.array(lens), LIMITS)


def test_valid_batch_passes_and_converts():
    idx, cu, lens = call([3, 9, 0], [0, 1, 4, 5])
    assert idx.dtype == cu.dtype == lens.dtype == np.int32
    idx, cu, lens = validate_batch(torch.tensor([1]), torch.tensor([0, 2]), torch.tensor([3]), LIMITS)
    assert idx.tolist() == [1]
    assert call([], [0])[0].shape == (0,)


@pytest.mark.parametrize("idx, cu, lens, message", [
    ([1, 2], [0, 2, 1], None, "strictly increasing"),
    ([1, 2], [0, 0, 1], None, "request 0 has 0"),
    ([1, 2], [0, 1, 5], None, "4 logits rows, above max_num_logits_per_req"),
    ([1, 2], [1, 2, 3], None, "must start at 0"),
    ([1, 2], [0, 1], None, "n\\+1 = 3 entries"),
    ([1, 1], [0, 1, 2], None, "slot 1 appears more than once"),
    ([1, 10], [0, 1, 2], None, "slot 10 in idx_mapping is out of range"),
    ([-1, 2], [0, 1, 2], None, "slot -1"),
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], None, "exceeds max_num_reqs"),
    ([1, 2], [0, 1, 2], [1], "seq_lens must have n = 2"),
    ([1, 2], [0, 1, 2], [1, -1], "seq_lens must be >= 0"),
])
def test_bad_batches_raise_clearly(idx, cu, lens, message):
    with pytest.raises(InvalidBatchError, match=message):
        call(idx, cu, lens)


def test_bad_types_raise_clearly():
    with pytest.raises(InvalidBatchError, match="must hold integers"):
        validate_batch(np.array([1.0]), np.array([0, 1]), np.array([1]), LIMITS)
    with pytest.raises(InvalidBatchError, match="must be 1-D"):
        validate_batch(np.array([[1]]), np.array([0, 1]), np.array([1]), LIMITS)
    with pytest.raises(InvalidBatchError, match="outside int32"):
        validate_batch(np.array([2**40]), np.array([0, 1]), np.array([1]), LIMITS)
    if torch.cuda.is_available():
        with pytest.raises(InvalidBatchError, match="host array"):
            validate_batch(torch.tensor([1], device="cuda"), np.array([0, 1]), np.array([1]), LIMITS)


@pytest.mark.parametrize("value, position", [
    ([0, True], 1), ((False, 2), 0), ([np.int32(1), np.bool_(True)], 1), ([0, np.array(True)], 1),
    ([0, torch.tensor(False)], 1), ([True, 2**70], 0)])
def test_a_bool_among_listed_ints_is_refused_not_read_as_0_or_1(value, position):
    with pytest.raises(InvalidTypeError, match=rf"^idx_mapping must hold integers, got bool .* at position {position}$"):
        to_host_int32("idx_mapping", value)
    with pytest.raises(InvalidTypeError, match="must hold integers, got dtype bool"):
        to_host_int32("idx_mapping", [False, True])  # all bools: refused by dtype, as before


def test_object_arrays_of_int32_integers_convert_exactly():
    for value in (np.array([0, 1], dtype=object), np.array([np.int64(-2**31), 2**31 - 1], dtype=object),
                  np.array([], dtype=object)):
        out = to_host_int32("idx_mapping", value)
        assert out.dtype == np.int32 and out.tolist() == [int(v) for v in value]
    idx, cu, lens = validate_batch(np.array([3, 1], dtype=object), np.array([0, 1, 2], dtype=object),
                                   np.array([5, 6], dtype=object), LIMITS)
    assert (idx.tolist(), cu.tolist(), lens.tolist()) == ([3, 1], [0, 1, 2], [5, 6])


@pytest.mark.parametrize("value, error, message", [
    (np.array([0, 2**31], dtype=object), InvalidBatchError, "^idx_mapping has values outside int32$"),
    (np.array([-2**31 - 1, 0], dtype=object), InvalidBatchError, "^idx_mapping has values outside int32$"),
    (np.array([0, 2**400], dtype=object), InvalidBatchError, "^idx_mapping has values outside int32$"),
    (np.array([0, 1.0], dtype=object), InvalidTypeError, r"must hold integers, got float 1\.0 at position 1"),
    (np.array([0, True], dtype=object), InvalidTypeError, "must hold integers, got bool True at position 1"),
    (np.array(["a" * 100, 1], dtype=object), InvalidTypeError, r"got str 'a{39}\.\.\. at position 0"),
    (np.array([None, 2**70], dtype=object), InvalidTypeError, "got NoneType None at position 0"),
])
def test_object_arrays_are_refused_for_the_right_reason(value, error, message):
    with pytest.raises(error, match=message) as info:
        to_host_int32("idx_mapping", value)
    assert error is InvalidTypeError or not isinstance(info.value, TypeError)


def test_masked_arrays_are_refused_where_masked_and_read_where_not():
    with pytest.raises(InvalidBatchError, match="^idx_mapping has masked entries$"):
        to_host_int32("idx_mapping", np.ma.array([0, 1], mask=[False, True], dtype=np.int32))
    with pytest.raises(InvalidBatchError, match="^seq_lens has masked entries$"):
        validate_batch(np.array([0, 1]), np.array([0, 1, 2]), np.ma.masked_less([5, -1], 0), LIMITS)
    for value in (np.ma.array([0, 7], dtype=np.int32), np.ma.array([0, 7], mask=[False, False])):
        out = to_host_int32("idx_mapping", value)
        assert type(out) is np.ndarray and out.dtype == np.int32 and out.tolist() == [0, 7]
