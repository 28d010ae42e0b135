"""On a GPU, `capture()` compiles the sampler's variants before its warm-up runs: those runs,
and a later step above the largest bucket, then find every sampler variant in memory (none is
compiled by a launch), and the steps equal the oracle. Reports the compile's share of the
capture (`gpu_report`)."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton import knobs

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.runtime.launch import launch
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import unpack

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# A vocabulary no other test uses: every sampler variant here is new to the process.
CFG = Config(vocab_size=31991, max_num_reqs=16, max_num_logits_per_req=1, max_num_slots=16,
             logits_dtype="bfloat16", graph_backend="cuda", num_logprobs=5, buckets=(1, 8))
SAMPLER = ("_scan_kernel", "_finish_kernel")


@triton.jit
def _probe_kernel(x_ptr, TAG: tl.constexpr):
    # TAG makes each case's probe a variant of its own: one compiled by an earlier case is in
    # memory, and its launch would not reach the watch.
    tl.store(x_ptr, TAG)


# Without bitmask support another vocabulary again: its lean scans would otherwise be in memory.
@pytest.mark.parametrize("grammar, vocab", [(True, 31991), (False, 31989)])
def test_capture_compiles_the_sampler_ahead_and_no_step_compiles_one(gpu_report, grammar, vocab):
    cfg = CFG.replace(grammar_bitmask=grammar, vocab_size=vocab)
    engine = Engine(cfg)
    missed = []
    compile_ahead = engine._compile_samplers

    def note_miss(*, fn, **_):
        missed.append(fn.name)
        return False  # compile it, as a launch would

    def then_watch(keys):
        compile_ahead(keys)
        # From here on a variant missing from memory is compiled by the launch that needs it.
        knobs.runtime.jit_cache_hook = note_miss

    engine._compile_samplers = then_watch
    tables = SlotTables(cfg.max_num_slots, engine.device)
    gen = torch.Generator(device=engine.device).manual_seed(0)
    steps = []
    try:
        engine.capture()
        for slot in range(cfg.max_num_slots):
            params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=slot,
                                    num_logprobs=5)
            engine.add_request(slot, params)
            tables.set(slot, params)
        for n in (1, 5, 8, 12):  # 12: above the largest bucket, an eager step
            logits = (torch.randn(n, engine.vocab, generator=gen, device=engine.device) * 3
                      ).to(torch.bfloat16)
            idx = np.arange(n, dtype=np.int32)
            cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 7, np.int32)
            engine.step(idx, cu, lens, logits)
            steps.append((idx, cu, lens, logits, engine.read().records.copy()))
        launch(_probe_kernel, (1,), torch.zeros(1, dtype=torch.int32, device=engine.device), vocab)
    finally:
        knobs.runtime.jit_cache_hook = None
    assert "_probe_kernel" in missed  # the watch saw a launch that compiled
    assert not [name for name in missed if name in SAMPLER], missed
    stats = engine.stats()
    assert stats["eager_fallbacks"] == 1
    # Two scans (one without bitmask support) and a finish at least.
    assert stats["sampler_variants_compiled"] >= (3 if grammar else 2)
    gpu_report("compile_ahead", {"grammar_bitmask": grammar,
                                 **{k: stats[k] for k in ("capture_s", "sampler_compile_s",
                                                          "sampler_variants_compiled")}})
    for idx, cu, lens, logits, records in steps:
        want = sample_unsharded(logits, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                tables=tables, layout=engine.layout, vocab_size=vocab,
                                bitmask_support=grammar)
        assert compare(unpack(torch.from_numpy(records), engine.layout), want) is None
