"""The NumPy model of the scan's capture (`benchmarks.capture_model`) follows the kernel's
constants: a row's first floor keeps at least its need, and its listing tiles are the
kernel's."""

from benchmarks import capture_model
from graphshard.sample.floors import HOT_FEW, HOT_SOME
from graphshard.sample.workspace import HOT_LANES, HOT_TILE


def test_programs_list_at_least_their_need_and_rows_pool_it():
    for mode, need, dtype in (("logprobs_5", 5, "float32"), ("top_k", 50, "bfloat16")):
        hot, pools = capture_model.model(mode, vocab=40000, rows=2, dtype=dtype)
        # A row's first program publishes a floor at or below its need-th largest lane; later
        # ones capture above the row's cut, which may leave them fewer.
        assert len(hot) == 2 * 3 and (hot[::3] >= need).all(), (mode, hot)
        assert (pools >= need).all(), (mode, pools)


def test_tiles_follow_the_kernel_limits():
    assert capture_model.tile(HOT_FEW.value) == str(HOT_FEW.value)
    assert capture_model.tile(HOT_FEW.value + 1) == str(HOT_SOME.value)
    assert capture_model.tile(HOT_TILE.value + 1) == f"{HOT_TILE.value}+{HOT_LANES.value - HOT_TILE.value}"
    assert capture_model.tile(HOT_LANES.value + 1) == "tile by tile"
