"""The oracle: an unsharded eager sampler over the whole batch on one process.

It runs the same sampler on the full-vocabulary logits in batch order, so a correct sharded
step returns exactly its tokens: draws depend on (slot seed, position, token id) only.
"""

from __future__ import annotations

import numpy as np
import torch

from graphshard.sample.params import SlotTables
from graphshard.sample.records import RecordLayout, SamplerOutput, unpack
from graphshard.sample.kernels import bitmask_words, sample


def sample_unsharded(full_logits: torch.Tensor, *, idx_mapping: np.ndarray, cu_num_logits: np.ndarray,
                     seq_lens: np.ndarray, tables: SlotTables, layout: RecordLayout, vocab_size: int,
                     draft_token_ids: torch.Tensor | None = None,
                     grammar_bitmask: torch.Tensor | None = None,
                     bitmask_support: bool = True, pdl: bool = False) -> SamplerOutput:
    """Sample the batch [n] from `full_logits` [num_logits, padded_vocab] (batch order).
    `bitmask_support` and `pdl` launch the sampler as an engine with that config's
    `grammar_bitmask` and `Engine.programmatic_launch` does (the same compiled kernels);
    without bitmask support no bitmask may be given."""
    if grammar_bitmask is not None and not bitmask_support:
        raise ValueError("grammar_bitmask given with bitmask_support=False")
    device = full_logits.device
    n = idx_mapping.shape[0]
    width = max(n, 1)

    def dev(a, length):
        out = np.zeros(length, dtype=np.int32)
        out[: a.shape[0]] = a
        return torch.from_numpy(out).to(device)

    records = torch.full((width, layout.width), -2, dtype=torch.int32, device=device)
    rows = full_logits.shape[0]
    # The engine's sampler has a bitmask and a device flag saying whether the step uses it
    # (unless its config has grammar_bitmask = false), and drafts whenever requests have
    # several rows (-1: none). The oracle launches the same way, so a run compiles one sampler
    # specialization, not one per input combination (each takes over a minute to compile for a
    # GPU). A flag of 0 leaves the mask unread and drafts of -1 accept nothing: the same as
    # passing neither. The choices the sampler makes by its grid's rows (chunks per scan
    # program, finish programs, the finish's register cap) can still differ between this grid
    # of n rows and the engine's bucket: one compile more, the same results.
    bitmask = dict(bitmask=None, bitmask_rows=None, bitmask_enabled=None)
    if bitmask_support:
        bitmask_on = torch.tensor([int(grammar_bitmask is not None)], dtype=torch.int32,
                                  device=device)
        if grammar_bitmask is None:
            grammar_bitmask = torch.zeros((1, bitmask_words(vocab_size)), dtype=torch.int32,
                                          device=device)
        bitmask = dict(bitmask=grammar_bitmask, bitmask_enabled=bitmask_on,
                       bitmask_rows=torch.arange(rows, dtype=torch.int32, device=device) * bitmask_on)
    if draft_token_ids is None and layout.max_num_logits_per_req > 1:
        draft_token_ids = torch.full((rows,), -1, dtype=torch.int32, device=device)
    sample(full_logits, vocab_size=vocab_size, num_reqs=torch.tensor([n], dtype=torch.int32, device=device),
           req_slots=dev(idx_mapping, width), cu_num_logits=dev(cu_num_logits, width + 1),
           seq_lens=dev(seq_lens, width), tables=tables, layout=layout, records=records,
           max_num_reqs=width, draft_tokens=draft_token_ids, pdl=pdl, **bitmask)
    return unpack(records[:n], layout)


def compare(got: SamplerOutput, want: SamplerOutput, *, logprob_atol: float = 1e-4) -> str | None:
    """None when equal (tokens, counts and ranks exactly; logprobs within tolerance), else why not."""
    for name in ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans", "topk_ids", "sampled_rank"):
        a, b = getattr(got, name), getattr(want, name)
        if a is None and b is None:
            continue
        a, b = a.cpu(), b.cpu()
        if not torch.equal(a, b):
            rows = (a != b).reshape(a.shape[0], -1).any(dim=1).nonzero().flatten().tolist()
            return f"{name} differs at requests {rows[:8]}: got {a[rows[0]].tolist()}, want {b[rows[0]].tolist()}"
    for name in ("topk_logprobs", "sampled_logprob"):
        a, b = getattr(got, name), getattr(want, name)
        if a is None and b is None:
            continue
        a, b = a.cpu(), b.cpu()
        same_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
        close = torch.isclose(a, b, atol=logprob_atol, rtol=1e-5) | same_inf | (torch.isnan(a) & torch.isnan(b))
        if not bool(close.all()):
            return f"{name} differs beyond {logprob_atol}"
    return None
