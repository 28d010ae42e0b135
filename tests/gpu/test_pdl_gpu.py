"""On a GPU of compute capability 9.0+, an engine whose kernels are launched as programmatic
dependents (`programmatic_launch = true`) returns exactly what one without does, step after
step with no wait between them: every step changes the batch (slots, positions, parameters,
logits), so a kernel that read its predecessor's output before the predecessor wrote it
(the scan reading the previous step's fetched inputs, the publish the previous records) would
return another step's tokens. With bitmask support every third step passes a bitmask, so the
steps alternate between each bucket's two graphs (`bitmask_free_graphs`)."""

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.runtime.pdl import supports_pdl
from graphshard.sample.kernels import bitmask_words
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import unpack

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or not supports_pdl("cuda"),
                                reason="needs a CUDA GPU of compute capability 9.0 or newer")

CFG = Config(vocab_size=32000, max_num_reqs=12, max_num_logits_per_req=1, max_num_slots=24,
             logits_dtype="bfloat16", graph_backend="cuda", num_logprobs=5, buckets=(1, 8))
KINDS = [dict(temperature=0.0), dict(temperature=0.8, top_k=50, top_p=0.9),
         dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, min_p=0.05),
         dict(temperature=0.0, num_logprobs=5), dict(temperature=0.7, num_logprobs=3)]


@pytest.mark.parametrize("grammar", [True, False])
def test_dependent_launches_return_what_plain_launches_do(grammar):
    cfg = CFG.replace(grammar_bitmask=grammar)
    plain = Engine(cfg.replace(programmatic_launch=False))
    dependent = Engine(cfg.replace(programmatic_launch=True))
    assert dependent.programmatic_launch and not plain.programmatic_launch
    tables = SlotTables(cfg.max_num_slots, plain.device)
    for slot in range(cfg.max_num_slots):
        params = SamplingParams(**KINDS[slot % len(KINDS)], seed=slot)
        for e in (plain, dependent):
            e.add_request(slot, params)
        tables.set(slot, params)
    for e in (plain, dependent):
        e.capture()
    rng = np.random.default_rng(0)
    gen = torch.Generator(device=plain.device).manual_seed(0)
    batches = []
    for i in range(240):
        n = int(rng.choice([1, 1, 5, 8, 11]))  # 11: above the largest bucket (an eager step)
        idx = rng.permutation(cfg.max_num_slots)[:n].astype(np.int32)
        lens = rng.integers(0, 10**6, n).astype(np.int32)
        logits = (torch.randn(n, plain.vocab, generator=gen, device=plain.device) * 3
                  ).to(torch.bfloat16)
        mask = None
        if grammar and i % 3 == 1:  # about half the tokens allowed on each row
            mask = torch.randint(-2**31, 2**31 - 1, (n, bitmask_words(cfg.vocab_size)),
                                 generator=gen, device=plain.device, dtype=torch.int32)
        batches.append((idx, np.arange(n + 1, dtype=np.int32), lens, logits, mask))
    results = {}
    for e in (plain, dependent):
        # Each step issued before the previous one is read: two in flight, back to back.
        records = []
        for i, (idx, cu, lens, logits, mask) in enumerate(batches):
            e.inputs.logits[:len(idx)].copy_(logits)  # stream-ordered after the step in flight
            e.step(idx, cu, lens, None, grammar_bitmask=mask)
            if i:
                records.append(e.read(e.steps - 2).records.copy())
        records.append(e.read().records.copy())
        results[id(e)] = records
    mismatches = [i for i, (a, b) in enumerate(zip(results[id(plain)], results[id(dependent)]))
                  if not np.array_equal(a, b)]
    assert not mismatches, mismatches[:10]
    for i in list(range(0, len(batches), 12)) + list(range(1, len(batches), 24)):
        # The oracle on every twelfth step, and every eighth masked one.
        idx, cu, lens, logits, mask = batches[i]
        want = sample_unsharded(logits, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                tables=tables, layout=plain.layout, vocab_size=cfg.vocab_size,
                                grammar_bitmask=mask, bitmask_support=grammar)
        got = unpack(torch.from_numpy(results[id(dependent)][i]), plain.layout)
        assert compare(got, want) is None, i
    assert dependent.stats()["eager_fallbacks"] > 0
    for e in (plain, dependent):  # with bitmask support, both graphs of each bucket replayed
        replayed = {key for key, count in e.stats()["replays"].items() if count}
        assert replayed == {(b, "replicate", 0, *kind) for b in cfg.buckets
                            for kind in ([(), ("no_bitmask",)] if grammar else [()])}
