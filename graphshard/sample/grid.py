"""The sampler's launch geometry: the tile of both kernels, the vocabulary chunks a scan program
streams, the programs the finish gives each row, and each kernel's launch options.

Every choice here depends only on static bounds (the grid's rows, the vocabulary, the layout),
so a captured graph keeps it, and none changes a result: a chunk's partial results are the same
whatever program streams it, and a row's finish programs settle it to the same record
(`graphshard.sample.kernels` says why for each kernel)."""

from __future__ import annotations

import triton

from graphshard.sample.candidates import STAT_WORDS
from graphshard.sample.nucleus import COUNT_BITS, MAX_PROGRAMS
from graphshard.sample.workspace import HOT_LANES, SMALL_ROW_SPLITS

# Launch option of both kernels: no fused multiply-add. A score `x * inv_temp` must round the
# same wherever it is computed (the scan, the pool, the reference): fused into `x * inv_temp -
# max` it keeps the product's rounding error, which at a temperature of 1e-30 is ~1e24.
NO_FMA = dict(enable_fp_fusion=False)
MAX_BLOCK_SIZE = 2048
# Tile of the split scan: 1024 columns over 8 warps keep its per-lane state within 64 registers
# (four programs per SM); 2048 needed ~150.
SCAN_BLOCK_SIZE = 1024
# Registers per thread of the scan without bitmask support: 64 * 256 threads fit four programs
# per SM (`scan_options`).
LEAN_SCAN_REGISTERS = 64
# Vocabulary chunks a scan program streams, by the rows of the launch's grid (its static bound,
# so a captured graph keeps its choice): at large batch one capture step per several chunks
# costs less than one per chunk, at small batch a row needs every program it can get. A
# program's chunks keep their own partial results, so the choice changes no result. On an H200
# (BENCHMARKS.md, V = 152064 fp32, batch 1024) two chunks make the top-k + top-p scan 14 %
# faster (363 -> 311 µs) and the greedy scan 3 % slower (168 -> 173; the two-chunk scan
# spills); four leave top-p nuclei out of the pools. Rows of at most SMALL_ROW_SPLITS chunks
# keep one chunk per program (`scan_group`).
SPLITS_PER_PROGRAM = ((256, 2),)
# The scan unrolls its chunk loop: a bound on its code size.
MAX_SPLITS_PER_PROGRAM = 4
# Programs the finish gives each row, by the rows of its grid (a static bound, like the scan's
# chunks per program, so a captured graph keeps its choice): at small batch a top-p row's large
# pool is drawn by several of them (`nucleus`); at large batch the rows alone fill the GPU.
# Between, four: a batch of mixed parameters has a few rows whose nucleus reaches below the
# pool among many cheap ones, and one program each left them on the step's critical path (the
# mixed workload at tp = 1 on an H100, grids of 66-192 rows: the device work after a graph
# step's issue 188 -> 105 µs p50). A grid of only deep top-p rows gains nothing from the split
# and pays for it (128 rows of V = 152064 fp32, top-p alone: scan + finish 104 -> 135 µs;
# other modes 1.4-5.3 µs more). BENCHMARKS.md, "Four finish programs for mid-size grids".
FINISH_PROGRAMS = ((64, 16), (192, 4))
# A one-program finish of 8 warps over a grid of at least FINISH_CAPPED_ROWS rows is held to
# FINISH_REGISTERS per thread (ptxas spills ~1.5 KB): four programs per SM instead of two
# (128 registers without bitmask support; ~170 with it, one per SM), which a batch that fills
# the GPU with rows alone turns into speed and a smaller one does not (BENCHMARKS.md, H200, the
# finish without bitmask support: at batch 1024 20-37 % less time at V = 152064 fp32, 36-60 %
# at 128256 bf16; at 256 up to 5 % more). The same code and layouts, so the same results: 4
# warps instead, as fast, would change the order of the finish's block-wide sums.
FINISH_CAPPED_ROWS = 512
FINISH_REGISTERS = 64
# A finish that splits rows over programs (8 warps) is held to SPLIT_FINISH_REGISTERS, two
# programs per SM: ptxas chose 128 for it (spilling 168 bytes) until the deep draw's first
# round by the row's programs (`deep_split`), then 191-196 with no spill, which leaves one
# program per SM for every mode of the small batches (CPU compile, sm_90a).
SPLIT_FINISH_REGISTERS = 128
# Tile of the whole-row paths: their wider per-token state would cost registers.
SMALL_BLOCK_SIZE = 512


def tile_block(vocab_size: int, k_p: int, block_size: int | None) -> int:
    """The vocabulary tile of a launch: `block_size` (a power of two) or the default."""
    if block_size is None:
        block_size = min(MAX_BLOCK_SIZE, triton.next_power_of_2(vocab_size))
    if block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    # The running top-K merge takes a tile's top K_P, so a tile holds at least K_P tokens.
    return max(block_size, k_p, 16)


def _tile_options(block: int) -> dict:
    """Both kernels' options for a tile of `block` columns: 8 warps from 1024 columns."""
    return dict(num_warps=8 if block >= 1024 else 4, **NO_FMA)


def scan_options(has_bitmask: bool, block: int) -> dict:
    """Launch options of `_scan_kernel`'s variant. The variant without bitmask support is held to
    LEAN_SCAN_REGISTERS: it streams at memory speed only with four programs of 8 warps per SM, and
    left alone ptxas gives it a few registers more than that for code that runs after the
    stream (it fits in 64 with no spills when asked)."""
    options = _tile_options(block)
    if not has_bitmask:
        options["maxnreg"] = LEAN_SCAN_REGISTERS
    return options


def scan_group(grid_rows: int, splits: int, override: int | None) -> int:
    """Vocabulary chunks a scan program streams: `override` (the launcher's
    `splits_per_program`) or SPLITS_PER_PROGRAM's choice for the grid's rows."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) \
                or not 1 <= override <= MAX_SPLITS_PER_PROGRAM:
            raise ValueError(f"splits_per_program must be an int in [1, "
                             f"{MAX_SPLITS_PER_PROGRAM}], got {override!r}")
        return min(override, max(splits, 1))
    group = 1
    for rows, per_program in SPLITS_PER_PROGRAM:
        if grid_rows >= rows:
            group = per_program
    if splits <= SMALL_ROW_SPLITS:
        # Two of a small row's chunks would need twice its larger capture (`chunk_top`) from
        # one program, past its HOT_LANES: on an H100 at V = 32000 bf16 that doubled the top-p
        # scan at batch 256 and 1024; one chunk per program cost greedy 0.6-1.8 µs there
        # (BENCHMARKS.md).
        group = 1
    return min(group, max(splits, 1))


def finish_options(grid_rows: int, programs: int, block: int) -> dict:
    """Launch options of `_finish_kernel` (see FINISH_CAPPED_ROWS)."""
    options = _tile_options(block)
    if options["num_warps"] == 8 and programs == 1 and grid_rows >= FINISH_CAPPED_ROWS:
        options["maxnreg"] = FINISH_REGISTERS
    elif options["num_warps"] == 8 and programs > 1:
        options["maxnreg"] = SPLIT_FINISH_REGISTERS
    return options


def count_tiles(options: dict) -> int:
    """Tiles a step of the finish's counts over a row (`resolve.count_row`): four, all loaded
    before any is counted, except in a finish held to FINISH_REGISTERS. On an H100 a row's count
    at V = 152064 fp32 took ~23 µs against ~39 with one tile a step; the held finish's code,
    which no row of those batches counts, made its logprob rows ~1 µs slower at batch 1024 with
    four (BENCHMARKS.md), so it keeps one."""
    return 1 if options.get("maxnreg") == FINISH_REGISTERS else 4


def finish_programs(grid_rows: int, splits: int, cap: int, vocab_size: int,
                    override: int | None) -> int:
    """Programs per row of the finish (each weighs `kernels.finish_slice` pool entries):
    `override` (the launcher's `finish_programs`) or FINISH_PROGRAMS' choice for the grid's
    rows, fewer where the workspace has no room."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, int) \
                or override not in (1, 2, 4, 8, 16) or override > MAX_PROGRAMS.value:
            raise ValueError(f"finish_programs must be 1, 2, 4, 8 or 16, got {override!r}")
        programs = override
    else:
        programs = next((p for rows, p in FINISH_PROGRAMS if grid_rows <= rows), 1)
    # Each program's results go to the row's hot-lane scratch; the pool count word holds the
    # count below the arrival fields; a slice under 16 entries is not worth a program.
    while programs > 1 and (programs * STAT_WORDS.value > splits * HOT_LANES.value
                            or cap // programs < 16):
        programs //= 2
    if splits < 2 or vocab_size >= 2**COUNT_BITS.value:
        programs = 1
    return programs
