"""float64 NumPy reference of `graphshard.sample.kernels.sample`: the same contract, written plainly
(sorting allowed), with the same counter-based RNG (`graphshard.sample.rng`, NumPy versions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from graphshard.sample import rng
from graphshard.sample.params import SamplingParams

_FIELDS = ("temperature", "top_k", "top_p", "min_p", "seed_lo", "seed_hi", "num_logprobs")


def _slot_params(params, slot: int) -> dict:
    """One slot's parameters, float fields rounded to float32 as the device tables hold them.

    `params` is a sequence or mapping slot -> SamplingParams, or an object with per-slot array
    attributes named like SlotTables' (temperature, top_k, ..., seed_lo, seed_hi)."""
    if isinstance(params, (Mapping, Sequence)):
        p = params[slot]
        if not isinstance(p, SamplingParams):
            p = SamplingParams(**p)
        lo, hi = rng.split_seed(p.seed)
        raw = dict(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                   seed_lo=lo, seed_hi=hi, num_logprobs=p.num_logprobs)
    else:
        raw = {f: np.asarray(_to_numpy(getattr(params, f)))[slot] for f in _FIELDS}
    out = {f: int(raw[f]) for f in ("top_k", "seed_lo", "seed_hi", "num_logprobs")}
    out.update({f: float(np.float32(raw[f])) for f in ("temperature", "top_p", "min_p")})
    return out


def _to_numpy(x):
    return x.cpu().numpy() if hasattr(x, "cpu") else x


def _allowed(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    words = bitmask_row.astype(np.int64) & 0xFFFFFFFF
    t = np.arange(vocab_size)
    return ((words[t // 32] >> (t % 32)) & 1).astype(bool)


def kept_mask(s: np.ndarray, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """Kept-token mask of the scaled scores `s` after top-k, top-p, min-p."""
    vocab_size = s.shape[0]
    keep = np.ones(vocab_size, dtype=bool)
    s_max = s.max()
    # Scores relative to the max, the max's own 0 even where it is +inf (inf - inf is NaN): +inf
    # scores then hold all of the row's mass and are all a min-p filter keeps.
    with np.errstate(invalid="ignore"):
        rel = np.where(s == s_max, 0.0, s - s_max)
    if 0 < top_k < vocab_size:
        kth = np.sort(s)[::-1][top_k - 1]
        keep &= s >= kth
    if top_p < 1.0:
        w = np.where(keep, np.exp(rel), 0.0)
        order = np.argsort(-s, kind="stable")
        mass = np.cumsum(w[order])
        cut = int(np.searchsorted(mass, top_p * mass[-1], side="left"))
        keep &= s >= s[order[min(cut, vocab_size - 1)]]
    if min_p > 0.0:
        # p / p_max >= min_p, compared in the log domain: exp(s - s_max) rounds to 1 for scores
        # within float64 precision of the max (huge temperatures), the log form does not.
        keep &= rel >= np.log(min_p)
    return keep


def _sample_row(x: np.ndarray, p: dict, position: int) -> int:
    """Token of one row from its masked logits (NaN and disallowed already -inf)."""
    if not np.isfinite(x).any():
        return 0
    if p["temperature"] == 0.0:
        return int(np.argmax(x))
    s = x / p["temperature"]
    keep = kept_mask(s, p["top_k"], p["top_p"], p["min_p"])
    key = rng.row_key_np(p["seed_lo"], p["seed_hi"], position)
    g = rng.gumbel_np(key, np.arange(x.shape[0]))
    z = np.where(keep, s + g, -np.inf)
    return int(np.argmax(z))


def _logprobs(raw: np.ndarray, token: int, num: int, K: int):
    """(top-K ids, top-K logprobs, token logprob, token rank) of one row's raw logits."""
    top = raw.max()
    with np.errstate(invalid="ignore"):  # a +inf top: NaN logprobs, as documented
        lse = 0.0 if top == -np.inf else top + np.log(np.exp(raw - top).sum())
    lp = raw - lse
    order = np.lexsort((np.arange(raw.shape[0]), -raw))[:K]
    ids = np.full(K, -1, np.int32)
    vals = np.full(K, -np.inf)
    n = min(num, K, raw.shape[0])
    ids[:n] = order[:n]
    vals[:n] = lp[order[:n]]
    rank = 1 + int((raw > raw[token]).sum())
    return ids, vals, lp[token], rank


def sample_ref(logits: np.ndarray, *, vocab_size: int, req_slots, cu_num_logits, seq_lens,
               params, K: int = 0, max_num_logits_per_req: int | None = None,
               draft_tokens=None, bitmask=None, bitmask_rows=None) -> dict:
    """Reference results for the n = len(req_slots) requests, as a dict of arrays:
    tokens [n, M], num_sampled, num_rejected, num_nans [n], and with K > 0 topk_ids [n, M, K],
    topk_logprobs [n, M, K], sampled_logprob [n, M], sampled_rank [n, M]."""
    logits = np.asarray(logits, dtype=np.float64)
    req_slots = np.asarray(req_slots)
    cu = np.asarray(cu_num_logits)
    seq_lens = np.asarray(seq_lens)
    n = len(req_slots)
    counts = np.diff(cu[: n + 1])
    M = max_num_logits_per_req if max_num_logits_per_req is not None else int(counts.max(initial=1))
    out = dict(
        tokens=np.full((n, M), -1, np.int32),
        num_sampled=np.zeros(n, np.int32),
        num_rejected=np.zeros(n, np.int32),
        num_nans=np.zeros(n, np.int32),
    )
    if K > 0:
        out.update(topk_ids=np.full((n, M, K), -1, np.int32),
                   topk_logprobs=np.full((n, M, K), -np.inf),
                   sampled_logprob=np.full((n, M), -np.inf),
                   sampled_rank=np.zeros((n, M), np.int32))
    for j in range(n):
        p = _slot_params(params, int(req_slots[j]))
        m = min(int(counts[j]), M)
        if m == 0:
            continue
        samples, raws = [], []
        for r in range(m):
            row = int(cu[j]) + r
            raw = logits[row, :vocab_size].copy()
            nan = np.isnan(raw)
            out["num_nans"][j] += int(nan.any())
            raw[nan] = -np.inf
            x = raw.copy()
            if bitmask is not None:
                x[~_allowed(np.asarray(bitmask)[int(bitmask_rows[row])], vocab_size)] = -np.inf
            samples.append(_sample_row(x, p, int(seq_lens[j]) + r))
            raws.append(raw)
        accepted = 0
        if draft_tokens is not None:
            drafts = np.asarray(draft_tokens)[int(cu[j]):int(cu[j]) + m]
            while accepted < m - 1 and samples[accepted] == int(drafts[accepted]):
                accepted += 1
        out["tokens"][j, : accepted + 1] = samples[: accepted + 1]
        out["num_sampled"][j] = accepted + 1
        out["num_rejected"][j] = m - 1 - accepted
        if K > 0 and p["num_logprobs"] > 0:
            for r in range(accepted + 1):
                ids, vals, lp, rank = _logprobs(raws[r], samples[r], p["num_logprobs"], K)
                out["topk_ids"][j, r] = ids
                out["topk_logprobs"][j, r] = vals
                out["sampled_logprob"][j, r] = lp
                out["sampled_rank"][j, r] = rank
    return out
