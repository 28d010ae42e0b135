import numpy as np
import pytest
import torch

from graphshard.engine.validate import BatchLimits, InvalidBatchError, validate_batch

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
