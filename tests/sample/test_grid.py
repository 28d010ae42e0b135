"""The sampler's launch geometry (`graphshard.sample.grid`): chunks per scan program and programs
per finish row by the grid's rows and the workspace's room, each kernel's launch options, and
clear errors for bad overrides."""

import pytest

from graphshard.sample import grid, kernels as sampler


def test_scan_group_by_grid_rows():
    rows, group = grid.SPLITS_PER_PROGRAM[0]
    assert grid.scan_group(rows - 1, 19, None) == 1
    assert grid.scan_group(rows, 19, None) == group
    assert grid.scan_group(rows, 1, None) == 1
    assert grid.scan_group(1, 19, 4) == 4
    assert grid.scan_group(1, 3, 4) == 3
    for bad in (0, -1, 5, 1.5, True, "2"):
        with pytest.raises(ValueError, match="splits_per_program"):
            grid.scan_group(1, 19, bad)


def test_finish_programs_by_grid_rows_and_room():
    # V = 152064: 19 chunks, a pool of 8192, slices of 256. Each bound's programs up to its rows,
    # the next bound's past them, one past the last.
    bounds = grid.FINISH_PROGRAMS
    assert [p for _, p in bounds] == sorted((p for _, p in bounds), reverse=True)
    for i, (rows, programs) in enumerate(bounds):
        assert grid.finish_programs(rows, 19, 8192, 152064, None) == programs
        after = bounds[i + 1][1] if i + 1 < len(bounds) else 1
        assert grid.finish_programs(rows + 1, 19, 8192, 152064, None) == after
    assert bounds[-1] == (192, 4)  # the mixed workload's largest grid (64 requests of 3 rows)
    assert grid.finish_programs(1, 19, 8192, 152064, 4) == 4
    assert [sampler.finish_slice(8192, p) for p in (1, 4, 16)] == [256, 256, 256]
    # Room: 2 chunks hold 640 scratch words (8 programs), a pool of 64 slices of 16 (4).
    assert grid.finish_programs(1, 2, 8192, 16000, 16) == 8
    assert grid.finish_programs(1, 4, 64, 200, 16) == 4
    assert sampler.finish_slice(64, 4) == 16
    # One chunk, or a vocabulary past the pool word's count bits: one program.
    assert grid.finish_programs(1, 1, 256, 200, 16) == 1
    assert grid.finish_programs(1, 200, 16384, 2**20, 16) == 1
    for bad in (0, 3, 32, 1.5, True, "2"):
        with pytest.raises(ValueError, match="finish_programs"):
            grid.finish_programs(1, 19, 8192, 152064, bad)


def test_finish_registers_capped_for_large_one_program_grids():
    rows, cap = grid.FINISH_CAPPED_ROWS, grid.FINISH_REGISTERS
    assert grid.finish_options(rows, 1, 1024) == dict(num_warps=8, maxnreg=cap, **grid.NO_FMA)
    assert grid.finish_options(rows - 1, 1, 1024) == dict(num_warps=8, **grid.NO_FMA)
    # Rows split over programs are held to two programs per SM; 4-warp finishes (small tiles)
    # keep every register.
    assert grid.finish_options(rows, 2, 1024) == dict(
        num_warps=8, maxnreg=grid.SPLIT_FINISH_REGISTERS, **grid.NO_FMA)
    assert grid.finish_options(rows, 1, 512) == dict(num_warps=4, **grid.NO_FMA)
    # Only the held finish counts a row one tile a step.
    assert grid.count_tiles(grid.finish_options(rows, 1, 1024)) == 1
    assert grid.count_tiles(grid.finish_options(rows - 1, 1, 1024)) == 4
    assert grid.count_tiles(grid.finish_options(rows, 2, 1024)) == 4
