"""On a GPU, `capture()` compiles the sampler's variants before its warm-up runs: those runs
then find every sampler variant in memory (none left for them to compile), and the steps equal
the oracle. Reports the compile's share of the capture (`gpu_report`)."""

import numpy as np
import pytest
import torch
from triton import knobs

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import unpack

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CFG = Config(vocab_size=32000, max_num_reqs=64, max_num_logits_per_req=1, max_num_slots=64,
             logits_dtype="bfloat16", graph_backend="cuda", num_logprobs=5, buckets=(1, 8, 64))


def test_capture_compiles_the_sampler_ahead_and_its_runs_compile_none(gpu_report):
    engine = Engine(CFG)
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
    try:
        engine.capture()
    finally:
        knobs.runtime.jit_cache_hook = None
    stats = engine.stats()
    assert not [name for name in missed if name in ("_scan_kernel", "_finish_kernel")], missed
    assert stats["sampler_variants_compiled"] >= 3  # two scans and a finish at least
    gpu_report("compile_ahead", {k: stats[k] for k in ("capture_s", "sampler_compile_s",
                                                       "sampler_variants_compiled")})
    tables = SlotTables(CFG.max_num_slots, engine.device)
    for slot in range(8):
        params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=slot, num_logprobs=5)
        engine.add_request(slot, params)
        tables.set(slot, params)
    gen = torch.Generator(device=engine.device).manual_seed(0)
    for n in (1, 5, 8):
        logits = torch.randn(n, engine.vocab, generator=gen, device=engine.device) * 3
        idx = np.arange(n, dtype=np.int32)
        cu, lens = np.arange(n + 1, dtype=np.int32), np.full(n, 7, np.int32)
        engine.step(idx, cu, lens, logits.to(torch.bfloat16))
        got = engine.read()
        want = sample_unsharded(logits.to(torch.bfloat16), idx_mapping=idx, cu_num_logits=cu,
                                seq_lens=lens, tables=tables, layout=engine.layout,
                                vocab_size=CFG.vocab_size)
        assert compare(unpack(torch.from_numpy(got.records), engine.layout), want) is None
