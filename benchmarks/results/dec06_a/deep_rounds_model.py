"""NumPy model of the deep nucleus draw's weighing rounds (`graphshard/sample/deep.py`): how many
passes of PIVOTS pivots a top-p 0.9 row of `randn * 3` logits needs before the threshold's
interval holds at most SORT_LIMIT (1024) tokens, for a first-round pivot step of 0.25 (the
code's `deep.STEP` before `deep.first_offsets`), 0.125 and 0.1, and for the first round's pivots
spaced by the pool's density as `deep.first_offsets` spaces them ("density"). The pool's floor is modelled as the largest of the chunks'
128th-largest scores. Prints, per vocabulary and temperature, for each step, how many of 20
rows took 1, 2, 3 and 4 rounds, and how many did not settle (last number; at V = 32000 the
modelled pool is not the code's, so ignore that line).

Usage: python3 benchmarks/results/dec06_a/deep_rounds_model.py   (CPU, ~2 minutes)
"""

import numpy as np

PIVOTS, SORT_LIMIT, TOP_P, CHUNK_TOP = 16, 1024, 0.9, 128


def density_offsets(s: np.ndarray, start: float, step: float = 0.25, aim: float = 900.0,
                    dense: int = 9, reach: float = 3.5) -> list:
    """`deep.first_offsets`: the pool holds every score >= start."""
    c0, c1 = (s >= start).sum(), (s >= start + step).sum()
    if c1 == 0 or c0 <= c1:
        return [k * step for k in range(PIVOTS - 1)]
    rate = np.log(c0 / c1) / step
    offs = [np.log1p(k * aim / c0) / rate for k in range(dense)]
    tail = max(step, (reach - offs[-1]) / (PIVOTS - 1 - dense))
    return offs + [offs[-1] + (k - dense + 1) * tail for k in range(dense, PIVOTS - 1)]


def rounds_of_row(s: np.ndarray, chunk: int, step) -> int:
    """Weighing rounds the deep draw takes on scores `s` (0: not settled in four); `step` a
    first-round pivot step, or "density"."""
    floors = [np.sort(s[c:c + chunk])[-CHUNK_TOP] for c in range(0, len(s), chunk)
              if len(s[c:c + chunk]) >= CHUNK_TOP]
    start = max(floors)
    w = np.exp(s - s.max())
    target = TOP_P * w.sum()
    hi, top = np.inf, start
    offsets = density_offsets(s, start) if step == "density" else None
    step = 0.25 if step == "density" else step
    for rounds in range(1, 5):
        if offsets is not None:
            pivots = np.array([top - o for o in offsets] + [-np.inf])
            offsets = None
        else:
            pivots = np.array([top - k * step for k in range(PIVOTS - 1)] + [-np.inf])
        mass = np.array([w[s >= p].sum() for p in pivots])
        count = np.array([(s >= p).sum() for p in pivots])
        reached = mass >= target
        j = int(np.argmax(reached)) if reached.any() else PIVOTS
        if j == PIVOTS or (j == 0 and hi == np.inf):
            return 0
        lo = pivots[j]
        above = count[j - 1] if j > 0 else (s >= hi).sum()
        hi = pivots[j - 1] if j > 0 else hi
        if count[j] - above <= SORT_LIMIT:
            return rounds
        step = (hi - lo) / (PIVOTS - 1) if np.isfinite(lo) else step
        top = hi - step
    return 0


def tally(vocab: int, temperature: float, step: float, rows: int = 20, seed: int = 1) -> list:
    rs = np.random.default_rng(seed)
    chunk = 8192 if vocab > 32000 else 2048
    got = [rounds_of_row(rs.standard_normal(vocab) * 3.0 / temperature, chunk, step)
           for _ in range(rows)]
    counts = np.bincount(got, minlength=5)
    return [int(c) for c in counts[1:5]] + [int(counts[0])]


if __name__ == "__main__":
    for vocab in (152064, 128256, 32000):
        for temperature in (1.0, 1.2, 1.5, 2.0):
            print(vocab, temperature, {step: tally(vocab, temperature, step)
                                       for step in (0.25, 0.125, 0.1, "density")})
