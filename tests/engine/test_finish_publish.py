"""A tp = 1 engine's steps of few record words end in the sampler's finish (`publish_in_finish`):
its last program to arrive copies the records into the host slot of the step's parity and
signals the step done, and no publish kernel runs; larger steps keep the publish kernel. Either
way `read()` returns each step's records (the last two steps'), the done word names the step,
and the records equal the oracle's. CPU, interpreter, emulated graphs."""

import numpy as np
import pytest
import torch

import graphshard.engine.readout as readout
import graphshard.sample.kernels as kernels
from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.harness.oracle import compare, sample_unsharded
from graphshard.runtime.hostcopy import HOST_COPY_WORDS, HostTarget
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout

# Records of 527 words (4 rows, 64 logprobs): buckets 1 and 4 fit one program's copy (4096
# words), bucket 8 and the eager steps of 9 and 10 requests do not.
CFG = Config(vocab_size=300, vocab_pad_multiple=8, max_num_reqs=10, max_num_logits_per_req=4,
             max_num_slots=12, buckets=(1, 4, 8), num_logprobs=64, graph_backend="emulated")
SETTINGS = [SamplingParams(temperature=0.0, num_logprobs=64),
            SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=1),
            SamplingParams(temperature=1.0, top_p=0.7, seed=2, num_logprobs=3),
            SamplingParams(temperature=0.6, min_p=0.1, seed=3)]


def _record_launches(monkeypatch) -> list:
    """(kernel name, whether a host target was passed) of every launch from here on."""
    launched = []

    def recorder(real):
        def record(kernel, grid, *args, **kwargs):
            # The finish takes it in its records tuple, the publish kernel as an argument.
            host = any(isinstance(a, HostTarget) or isinstance(a, tuple)
                       and any(isinstance(x, HostTarget) for x in a) for a in args)
            launched.append((kernel.fn.__name__, host))
            return real(kernel, grid, *args, **kwargs)
        return record

    monkeypatch.setattr(readout, "launch", recorder(readout.launch))
    monkeypatch.setattr(kernels, "launch", recorder(kernels.launch))
    return launched


def _engine(cfg) -> Engine:
    engine = Engine(cfg)
    engine.capture()
    for slot in range(cfg.max_num_slots):
        engine.add_request(slot, SETTINGS[slot % len(SETTINGS)])
    return engine


def test_small_steps_end_in_the_finish_and_read_the_same_records(monkeypatch):
    on, off = _engine(CFG), _engine(CFG.replace(publish_in_finish=False))
    width = on.layout.width
    assert on.stats()["finish_publishes"] == [1, 4] and off.stats()["finish_publishes"] == []
    launched = _record_launches(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    previous = None
    # Buckets 1, 4 and 8, an empty batch, steps above the largest bucket (eager), and back to
    # small ones.
    for step, n in enumerate((1, 3, 4, 0, 6, 8, 10, 2, 9, 1)):
        idx = torch.randperm(CFG.max_num_slots, generator=gen)[:n].numpy().astype(np.int32)
        rows = torch.randint(1, CFG.max_num_logits_per_req + 1, (n,), generator=gen).numpy()
        cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
        lens = np.full(n, 3 + step, np.int32)
        logits = torch.randn(int(cu[-1]), on.vocab_shard, generator=gen) * 3
        drafts = torch.randint(0, CFG.vocab_size, (int(cu[-1]),), generator=gen,
                               dtype=torch.int32)
        want = sample_unsharded(logits, idx_mapping=idx, cu_num_logits=cu, seq_lens=lens,
                                tables=on.tables, layout=on.layout, vocab_size=CFG.vocab_size,
                                draft_token_ids=drafts)
        bucket = on.graphs.bucket_for(n) or n
        for engine in (on, off):
            launched.clear()
            engine.host_records.slots[step & 1] = -7  # step - 2's slot: every word is rewritten
            out = engine.step(idx, cu, lens, logits, drafts)
            in_finish = engine is on and bucket * width <= HOST_COPY_WORDS
            finishes = [host for name, host in launched if name == "_finish_kernel"]
            assert finishes == [in_finish], (step, n, launched)
            names = [name for name, _ in launched]
            assert names.count("_publish_kernel") == (not in_finish), (step, n, names)
            assert engine.inputs.staged.finished() == step
            assert compare(out, want) is None, compare(out, want)
            assert np.array_equal(engine.read().records, out.to_host().records)
        assert np.array_equal(on.read().records, off.read().records)
        if previous is not None:  # the step before kept its own slot
            assert np.array_equal(on.read(step - 1).records, previous)
        previous = on.read().records


def _host_target(**changes) -> HostTarget:
    i64 = [torch.zeros(n, dtype=torch.int64) for n in (2, 1, 1, 1)]
    return HostTarget(*i64, torch.zeros(1, dtype=torch.int32))._replace(**changes)


# records_rows -2: two rows of a wider buffer (not contiguous).
@pytest.mark.parametrize("rows, records_rows, target, error", [
    (2, 2, "not a target", "host must be a HostTarget"),
    (0, 2, _host_target(), "max_num_reqs must be >= 1"),
    (2, 2, _host_target(slot_addresses=torch.zeros(1, dtype=torch.int64)),
     "host.slot_addresses must be a torch.int64 tensor of >= 2"),
    (2, 2, _host_target(last=torch.zeros(1, dtype=torch.int32)), "host.last must be a torch.int64"),
    (2, 2, _host_target(arrivals=None), "host.arrivals must be a torch.int32"),
    (700, 700, _host_target(), "at most 4096 words, got 700 x 8"),
    (2, -2, _host_target(), "at most 4096 words, got 2 x 8 with strides \\(16, 1\\)"),
])
def test_the_sampler_refuses_a_host_target_it_cannot_serve(rows, records_rows, target, error):
    i32 = dict(dtype=torch.int32)
    layout = RecordLayout(1, 1)
    records = torch.zeros(2, 2 * layout.width, **i32)[:, :layout.width] if records_rows < 0 \
        else torch.zeros(records_rows, layout.width, **i32)
    n = max(rows, 1)
    with pytest.raises((TypeError, ValueError), match=error):
        kernels.sample(torch.zeros(n, 64), vocab_size=64, num_reqs=torch.ones(1, **i32),
                       req_slots=torch.zeros(rows, **i32), cu_num_logits=torch.arange(rows + 1, **i32),
                       seq_lens=torch.zeros(rows, **i32), tables=SlotTables(1, "cpu"),
                       layout=layout, records=records, max_num_reqs=rows, host=target)
