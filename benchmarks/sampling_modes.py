"""Sampling settings the sampler benchmarks run, and the PyTorch sort sampler they compare with.

`MODES` maps a mode name to its `SamplingParams` (temperature 0.8 unless greedy; the settings
chat deployments use). `SHAPES` are the (vocabulary, logits dtype) pairs reported. Logits are
`randn * 3`, drawn once per shape.

`TorchSortSampler` is the baseline: the plain PyTorch sampler an engine falls back to without a
dedicated kernel library (one ascending sort per row, the top-k threshold by gather, top-p by
softmax + cumsum over the sorted row, scatter back, softmax, exponential race; min-p against the
max probability; logprobs by log_softmax + topk). It is a baseline, not graphshard API: it does
not reproduce graphshard's random draws, only its cost.
"""

from __future__ import annotations

import torch

from graphshard.sample.kernels import SamplerWorkspace, bitmask_words, sample
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout

TEMPERATURE = 0.8
MODES: dict[str, SamplingParams] = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature": SamplingParams(temperature=TEMPERATURE, seed=1),
    "top_k": SamplingParams(temperature=TEMPERATURE, top_k=50, seed=2),
    "top_p": SamplingParams(temperature=TEMPERATURE, top_p=0.9, seed=3),
    # A colder top-p: its nucleus is a few hundred tokens, at the top of the pool's pivots.
    "top_p_cold": SamplingParams(temperature=0.5, top_p=0.9, seed=8),
    # A warmer top-p: at temperature 1 the nucleus of `randn * 3` holds ~5000 tokens at V = 128256,
    # more than a pool of 128 per chunk holds (a flat row: early in a sentence, creative settings).
    # Seed 9's row at batch 1 takes the deep draw, as about one warm row in ten does; the others
    # cost a cold row's time or one count more (`benchmarks.warm_rows`, BENCHMARKS.md).
    "top_p_warm": SamplingParams(temperature=1.0, top_p=0.9, seed=9),
    "top_k_top_p": SamplingParams(temperature=TEMPERATURE, top_k=50, top_p=0.9, seed=4),
    "min_p": SamplingParams(temperature=TEMPERATURE, min_p=0.05, seed=5),
    "logprobs_5": SamplingParams(temperature=0.0, num_logprobs=5),
    "logprobs_20": SamplingParams(temperature=0.0, num_logprobs=20),
    "top_k_top_p_logprobs_5": SamplingParams(temperature=TEMPERATURE, top_k=50, top_p=0.9, seed=6,
                                             num_logprobs=5),
    # Random draws with logprobs and no filter: the sampled token's rank keeps 256 candidates
    # a chunk, and the top-K list comes from a pool of thousands.
    "temperature_logprobs_5": SamplingParams(temperature=TEMPERATURE, seed=7, num_logprobs=5),
}
SHAPES = ((152064, torch.float32), (128256, torch.bfloat16), (32000, torch.bfloat16))
BATCHES = (1, 8, 32, 256, 1024)
MAX_LOGPROBS = 20


def make_logits(rows: int, vocab: int, dtype: torch.dtype, device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(rows, vocab, device=device, generator=gen) * 3).to(dtype)


class TorchSortSampler:
    """One mode's PyTorch sort sampler over `logits` [batch, vocab]; `step()` returns the tokens
    (and leaves logprobs in `self.logprobs`). Allocation-free after the first call only as far
    as PyTorch's caching allocator makes it, which is what such a sampler costs in practice."""

    def __init__(self, params: SamplingParams, logits: torch.Tensor):
        self.p, self.logits = params, logits

    def step(self) -> torch.Tensor:
        p, x = self.p, self.logits.float()
        if p.num_logprobs:
            lp = torch.log_softmax(x, dim=-1)
            self.logprobs = lp.topk(p.num_logprobs, dim=-1)
        if p.temperature == 0.0:
            return x.argmax(dim=-1)
        x = x / p.temperature
        if p.top_k > 0 or p.top_p < 1.0:
            srt, order = x.sort(dim=-1, descending=False)
            if p.top_k > 0:
                kth = srt[:, -p.top_k].unsqueeze(1)
                srt = srt.masked_fill(srt < kth, float("-inf"))
            if p.top_p < 1.0:
                cum = srt.softmax(dim=-1).cumsum(dim=-1)
                drop = cum <= 1.0 - p.top_p
                drop[:, -1] = False
                srt = srt.masked_fill(drop, float("-inf"))
            x = torch.empty_like(srt).scatter_(-1, order, srt)
        probs = x.softmax(dim=-1)
        if p.min_p > 0.0:
            top = probs.amax(dim=-1, keepdim=True)
            probs = probs.masked_fill(probs < p.min_p * top, 0.0)
        race = torch.empty_like(probs).exponential_()
        return (probs / race).argmax(dim=-1)


def sampler_call(logits: torch.Tensor, vocab: int, params: SamplingParams, num_logprobs: int,
                 device, bitmask: bool = False, splits_per_program: int | None = None,
                 pdl: bool = False, chunk_size: int | None = None) -> tuple:
    """(call, workspace): `call()` launches the sampler once over `logits` [batch, padded vocab],
    every row a one-row request with `params` (layout K = `num_logprobs`, positions 100). With
    `bitmask`, as the engine launches it: a grammar bitmask that allows every token, switched on
    by a device flag (both scan variants launch; the bitmask one streams). `splits_per_program`
    overrides the sampler's choice of vocabulary chunks per scan program; `pdl` launches the
    sampler's kernels as programmatic dependents (as `Engine.programmatic_launch`); `chunk_size`
    overrides the workspace's vocabulary chunk per program. The set-up is done here, once:
    `call` only launches, so it can be timed or captured."""
    batch = logits.shape[0]
    layout = RecordLayout(1, num_logprobs)
    tables = SlotTables(batch, device)
    for slot in range(batch):
        tables.set(slot, params)
    records = torch.zeros(batch, layout.width, dtype=torch.int32, device=device)
    i32 = dict(dtype=torch.int32, device=device)
    idx, cu = torch.arange(batch, **i32), torch.arange(batch + 1, **i32)
    n, lens = torch.tensor([batch], **i32), torch.full((batch,), 100, **i32)
    ws = SamplerWorkspace.allocate(batch, 1, vocab, device, chunk_size=chunk_size)
    mask = {}
    if bitmask:
        mask = dict(bitmask=torch.full((batch, bitmask_words(vocab)), -1, **i32), bitmask_rows=idx,
                    bitmask_enabled=torch.ones(1, **i32))

    def call():
        sample(logits, vocab_size=vocab, num_reqs=n, req_slots=idx, cu_num_logits=cu, seq_lens=lens,
               tables=tables, layout=layout, records=records, max_num_reqs=batch, workspace=ws,
               splits_per_program=splits_per_program, pdl=pdl, **mask)

    return call, ws
