"""The sampler's static scratch: one int32 buffer the kernels take as one pointer.

Sections, in order (rows = max_num_reqs * M, one per logits row a launch may sample):
- top [rows, MAX_LOGPROBS] int64: scratch where a row's top-K logprob keys are sorted (first,
  so it is 8-byte aligned);
- partials [rows, NUM_PART, splits]: what each (row, vocabulary chunk) program found;
- fill [rows, 2]: candidates captured into the row's pool (an atomic counter), and the row's
  shared capture floor (the order key of the largest chunk floor published so far, an atomic
  max; 0 = none). The per-request kernel resets both to 0 after reading, so launches, graph
  replays included, start from 0;
- pool [rows, 2, pool_size]: the candidates' logit bits and ids (`candidates`);
- hot [rows, splits, HOT_LANES]: scratch where a scan program lists the lanes it reads again
  (`floors.capture_hot`); written before it is read;
- stats [NUM_STATS]: cumulative counts of rows the slower whole-row paths settled, and of rows
  the split nucleus draw settled;
- tokens [rows] and arrivals [max_num_reqs]: a request's settled tokens, and how many of its
  rows have settled (reset to 0 by the last, which writes the request's record).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Vocabulary columns per program: a 152K vocabulary spreads over 19 SMs.
CHUNK_SIZE = 8192
# The largest top-k the scan treats as small: its rows capture k candidates per scan program.
SMALL_TOP_K = 256
# Candidates a chunk captures for rows whose kept set has no small bound (top-p, min-p, the
# draws whose logprob rank is reported), per chunk a scan program streams: the nucleus of top-p
# 0.9 over 152K logits `randn * 3` at temperature 0.8 holds ~60 tokens of a chunk. On an H200
# (BENCHMARKS.md) 128 against 256 made top-p 0.9 at batch 1 33 % faster (53.7 -> 36.1 µs).
CHUNK_TOP = 128
# A row of at most SMALL_ROW_SPLITS chunks captures SMALL_ROW_CHUNK_TOP per chunk: its pool is
# the smallest, and at V = 32000 bf16 ~1 % of top-p 0.9 rows at temperature 0.8 had a nucleus
# reaching below it and took the deep draw, ~100 µs in one finish program, which at batch 256
# made the top-p sampler 5x the top-k + top-p one on an H100 (`benchmarks.pool_model`: 17 % of
# rows past the largest chunk floor at 128, 0.2 % at 192). With 192 none did, and the top-p
# sampler took 45 against 135 µs at batch 256 and 148 against 240 at 1024, 1-2 µs more at
# batches 1 and 32 (BENCHMARKS.md).
SMALL_ROW_SPLITS = 4
SMALL_ROW_CHUNK_TOP = 192
# Pool entries per row and chunk: twice CHUNK_TOP plus the ties of its floor, with headroom (a
# row's chunks share its pool: a small row's 192 per chunk fill half of it).
POOL_PER_SPLIT = 384
MAX_POOL = 16384

# Lanes a scan program's capture lists and reads again: HOT_TILE of them in one load per chunk,
# up to HOT_LANES - HOT_TILE more in a second, narrower one (a floor for 256 candidates, a
# program's CHUNK_TOP for two chunks or a top-k of 256, leaves a few more than 256 lanes hot:
# its rounding and ties). A program with more hot lanes re-reads them tile by tile.
HOT_TILE = tl.constexpr(256)
HOT_LANES = tl.constexpr(320)

# The largest top-K a layout may ask for (Config.num_logprobs is at most 64 too).
MAX_LOGPROBS = tl.constexpr(64)
NUM_PART = tl.constexpr(10)
P_NAN = tl.constexpr(0)  # 1 if the chunk holds a NaN
P_MAX_X = tl.constexpr(1)  # max masked logit
P_ARG_X = tl.constexpr(2)  # its lowest id
P_MAX_Z = tl.constexpr(3)  # max Gumbel score s + g over the allowed tokens (random rows)
P_ARG_Z = tl.constexpr(4)  # its lowest id
P_FLOOR_S = tl.constexpr(5)  # allowed tokens with a logit below this were not captured
P_FLOOR_R = tl.constexpr(6)  # tokens with a raw logit below this were not captured
P_MAX_R = tl.constexpr(7)  # max raw logit
P_SUM_R = tl.constexpr(8)  # sum exp(raw - chunk max raw)
P_SUM_S = tl.constexpr(9)  # sum exp(s - chunk max s) over the allowed tokens
NUM_STATS = tl.constexpr(9)
STAT_DRAWS = tl.constexpr(0)
STAT_LOGPROBS = tl.constexpr(1)
STAT_COUNTS = tl.constexpr(2)
STAT_SPLIT = tl.constexpr(3)  # rows the split nucleus draw settled (not a slower path)
STAT_DEEP = tl.constexpr(4)  # top-p rows whose nucleus reached below the pool (`deep`)
# Top-p rows whose nucleus reached below the pool and whose unfiltered winner lay above every
# floor: the pool's mass above the winner checked it (not a slower path).
STAT_POOL_CHECKS = tl.constexpr(5)
# Top-p rows whose nucleus reached below the pool and whose unfiltered winner lay below every
# floor, weighed over the row by all of the row's finish programs (`deep_split`).
STAT_DEEP_SPLIT = tl.constexpr(6)
# Of the STAT_SPLIT rows, those whose best Gumbel score above the threshold's interval beat the
# interval's, settled without gathering it (not a slower path).
STAT_SPLIT_BEATEN = tl.constexpr(7)
# Top-p rows of the one-program finish drawn by the race of `candidates.search_mass` (the best
# Gumbel score above the threshold's interval beat the interval's; not a slower path).
STAT_RACED = tl.constexpr(8)
# The slower paths `SamplerWorkspace.paths` reports, by stats word.
STAT_NAMES = {"draw_fallback": STAT_DRAWS.value, "logprobs_fallback": STAT_LOGPROBS.value,
              "counted": STAT_COUNTS.value, "deep": STAT_DEEP.value,
              "deep_split": STAT_DEEP_SPLIT.value}


@triton.constexpr_function
def padded(n):
    """A power of two >= n and >= 2: the width of a vector of n entries (tl.topk and the
    per-chunk reductions need two)."""
    return max(triton.next_power_of_2(n), 2)


@triton.jit
def workspace_row(workspace, row_id, SPLITS: tl.constexpr, CAP: tl.constexpr):
    """Pointers to one row's sections of `workspace` (buffer, its row count): (partials
    [NUM_PART, SPLITS], pool fill (its shared floor key is the next word), pool logits [CAP],
    pool ids [CAP], stats, top-K scratch [MAX_LOGPROBS] int64, hot-lane scratch [SPLITS,
    HOT_LANES])."""
    ws_ptr, rows = workspace
    row_id = row_id.to(tl.int64)
    ROWS = rows.to(tl.int64)
    top = ws_ptr.to(tl.pointer_type(tl.int64)) + row_id * MAX_LOGPROBS
    base = ws_ptr + ROWS * 2 * MAX_LOGPROBS
    part = base + row_id * (NUM_PART * SPLITS)
    fill = base + ROWS * NUM_PART * SPLITS + row_id * 2
    pool = base + ROWS * (NUM_PART * SPLITS + 2) + row_id * (2 * CAP)
    hot = base + ROWS * (NUM_PART * SPLITS + 2 + 2 * CAP) + row_id * (SPLITS * HOT_LANES)
    stats = base + ROWS * (NUM_PART * SPLITS + 2 + 2 * CAP + SPLITS * HOT_LANES)
    return part, fill, pool, pool + CAP, stats, top, hot


@triton.jit
def workspace_request(workspace, req, M: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr):
    """Pointers to one request's (settled tokens [M], arrival counter)."""
    ws_ptr, rows = workspace
    ROWS = rows.to(tl.int64)
    tokens = ws_ptr + ROWS * (2 * MAX_LOGPROBS + NUM_PART * SPLITS + 2 + 2 * CAP
                              + SPLITS * HOT_LANES) + NUM_STATS
    return tokens + req * M, tokens + ROWS + req


def chunk_size_for(vocab_size: int, chunk_size: int | None) -> int:
    if chunk_size is None:
        return min(CHUNK_SIZE, max(16, triton.next_power_of_2(vocab_size)))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 16 \
            or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16, got {chunk_size!r}")
    return chunk_size


def pool_size_for(splits: int, vocab_size: int, pool_size: int | None) -> int:
    if pool_size is None:
        # A launch captures a token at most once: the pool never holds more than the vocabulary.
        return min(MAX_POOL, triton.next_power_of_2(splits * POOL_PER_SPLIT),
                   max(16, triton.next_power_of_2(vocab_size)))
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 16 \
            or pool_size & (pool_size - 1):
        raise ValueError(f"pool_size must be a power of two >= 16, got {pool_size!r}")
    return pool_size


def section_sizes(reqs: int, m: int, splits: int, pool: int) -> dict[str, int]:
    """Sizes of the sections, in the order `workspace_row` and `workspace_request` lay them
    out."""
    rows = reqs * m
    return {"top": rows * 2 * MAX_LOGPROBS.value, "partials": rows * NUM_PART.value * splits,
            "fill": rows * 2, "pool": rows * 2 * pool, "hot": rows * splits * HOT_LANES.value,
            "stats": NUM_STATS.value, "tokens": rows, "arrivals": reqs}


class SamplerWorkspace:
    """Static scratch of the sampler (see the module docstring for its sections).

    Allocate one before graph capture, at the largest `max_num_reqs` any launch will use, and
    keep it alive as long as the graphs: a captured step must be given one (`sample` allocates
    a fresh one per call otherwise, which is for eager use only). Launches leave the pool fills
    and arrival counters at zero; everything else is written before it is read."""

    def __init__(self, buffer: torch.Tensor, max_num_reqs: int, max_num_logits_per_req: int,
                 vocab_size: int, chunk_size: int | None = None, pool_size: int | None = None):
        self.chunk_size = chunk_size_for(vocab_size, chunk_size)
        self.num_splits = -(-vocab_size // self.chunk_size)
        self.pool_size = pool_size_for(self.num_splits, vocab_size, pool_size)
        self.max_num_reqs, self.max_num_logits_per_req = max_num_reqs, max_num_logits_per_req
        self.vocab_size = vocab_size
        sizes = section_sizes(max_num_reqs, max_num_logits_per_req, self.num_splits,
                              self.pool_size)
        if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.int32:
            raise TypeError("buffer must be an int32 tensor")
        if buffer.dim() != 1 or buffer.shape[0] != sum(sizes.values()) or not buffer.is_contiguous():
            raise ValueError(f"buffer must be a contiguous [{sum(sizes.values())}] tensor, got "
                             f"shape {tuple(buffer.shape)}")
        self.buffer = buffer  # the kernels' one pointer; the views below are its sections
        (self.top, self.partials, self.fill, self.pool, self.hot, self.stats, self.tokens,
         self.arrivals) = torch.split(buffer, list(sizes.values()))

    @classmethod
    def allocate(cls, max_num_reqs: int, max_num_logits_per_req: int, vocab_size: int,
                 device: torch.device | str, *, chunk_size: int | None = None,
                 pool_size: int | None = None) -> SamplerWorkspace:
        """A workspace for launches with `max_num_reqs <=` this bound, the layout's M and this
        vocabulary. `chunk_size` (power of two >= 16) overrides the vocabulary chunk per program,
        `pool_size` (power of two >= 16) the candidates kept per row."""
        for name, v, low in (("max_num_reqs", max_num_reqs, 0),
                             ("max_num_logits_per_req", max_num_logits_per_req, 1),
                             ("vocab_size", vocab_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        chunk = chunk_size_for(vocab_size, chunk_size)
        splits = -(-vocab_size // chunk)
        pool = pool_size_for(splits, vocab_size, pool_size)
        size = sum(section_sizes(max_num_reqs, max_num_logits_per_req, splits, pool).values())
        # Zeros: the pool fills and arrival counters must start at 0.
        buffer = torch.zeros(size, dtype=torch.int32, device=device)
        return cls(buffer, max_num_reqs, max_num_logits_per_req, vocab_size, chunk, pool)

    def paths(self) -> dict[str, int]:
        """How many rows took the slower whole-row paths since allocation: `draw_fallback`
        (filtered draw), `logprobs_fallback` (top-K logprobs), `counted` (a count over the row:
        verifying the unfiltered winner, or the sampled token's rank), `deep` (a top-p draw by
        weighing passes over the row in the program that settles it: its nucleus reached below
        the pool), `deep_split` (a top-p row weighed over its row by all of its finish
        programs, small batches: its nucleus reached below the pool and its unfiltered winner
        below every floor; such a row also counts as `deep` when one program goes on to copy
        its threshold's interval). Every other row was settled from its candidates. Reads the
        device: for tests and benchmarks, not a step."""
        stats = self.stats.tolist()
        return {name: stats[i] for name, i in STAT_NAMES.items()}

    def split_draws(self) -> int:
        """How many top-p rows since allocation were drawn by several programs of the finish
        (`graphshard.sample.nucleus`). Reads the device: for tests and benchmarks."""
        return int(self.stats[STAT_SPLIT.value])

    def split_draws_beaten(self) -> int:
        """How many of the `split_draws` rows were settled by the best Gumbel score above the
        threshold's interval, without gathering and sorting the interval. Reads the device: for
        tests and benchmarks."""
        return int(self.stats[STAT_SPLIT_BEATEN.value])

    def pool_draws_raced(self) -> int:
        """How many top-p rows of the one-program finish were drawn by the best Gumbel score
        above the threshold's interval, without copying and sorting the interval
        (`candidates.search_mass`). Reads the device: for tests and benchmarks."""
        return int(self.stats[STAT_RACED.value])

    def pool_checks(self) -> int:
        """How many top-p rows since allocation had their unfiltered winner checked against the
        nucleus by the pool's mass above it, in place of a count over the row (`counted`).
        Reads the device: for tests and benchmarks."""
        return int(self.stats[STAT_POOL_CHECKS.value])
