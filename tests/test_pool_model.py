import numpy as np

from benchmarks.pool_model import outgrown


def test_a_flat_row_outgrows_a_small_capture_and_fits_a_whole_one():
    # 16 nearly equal scores, best first, in 4 chunks of 4: top-p 0.5 keeps ids 0-7, so
    # chunk 0 (ids 0-3) leaves out part of the nucleus unless it captures all 4.
    scores = -1e-3 * np.arange(16)
    assert outgrown(scores, (1, 2, 4), 0.5, chunk=4) == {1: True, 2: True, 4: False}


def test_a_peaked_row_settles_from_one_candidate_per_chunk():
    scores = np.full(16, -50.0)
    scores[9] = 0.0  # holds all but ~1e-20 of the mass
    assert outgrown(scores, (1,), 0.9, chunk=4) == {1: False}


def test_the_largest_chunk_floor_decides():
    # The nucleus of top-p 0.95 is {3.0, 2.5, 2.0}: chunk 0's floor lies above 2.0 while it
    # captures fewer than 3 (its third best is 0.0), chunk 1's (2.0 itself) never does.
    scores = np.array([3.0, 2.5, 0.0, 0.0, 2.0, -9.0, -9.0, -9.0])
    assert outgrown(scores, (1, 2, 3), 0.95, chunk=4) == {1: True, 2: True, 3: False}
