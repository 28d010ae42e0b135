"""On a GPU, the driver's copies (`runtime.memcpy`) write what `copy_` writes, in stream order:
a copy enqueued behind a long kernel waits for it, on the default stream and on a side
stream, and `StepInputs.write_tensors` takes them for its contiguous inputs, from the thread
that made the inputs and from a fresh one (where the driver may refuse and `copy_` runs)."""

import threading

import pytest
import torch

from graphshard.engine.inputs import StepInputs
from graphshard.runtime.memcpy import device_copier

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_driver_copies_are_stream_ordered_on_any_stream():
    device = torch.device("cuda", torch.cuda.current_device())
    copy = device_copier(device)
    assert copy is not None
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            a = torch.randn(4096, 4096, device=device)
            src = torch.zeros(1 << 20, device=device)
            dst = torch.full((1 << 20,), -1.0, device=device)
            for _ in range(4):  # long enough that an unordered copy would read zeros
                a = a @ a / 64
            src.fill_(3.0)
            assert copy(dst.data_ptr(), src.data_ptr(), src.numel() * 4)
            dst.add_(1.0)
        stream.synchronize()
        assert bool((dst == 4.0).all())


def test_write_tensors_takes_the_driver_path_and_writes_what_copy_writes():
    device = torch.device("cuda", torch.cuda.current_device())
    kw = dict(max_num_reqs=8, max_num_logits_per_req=3, vocab_shard=1000, bitmask_words=32,
              real_bitmask_words=32, logits_dtype=torch.bfloat16, device=device)
    fast, slow = StepInputs(**kw), StepInputs(**kw)
    assert fast._copier is not None
    slow._copier = None
    g = torch.Generator(device=device).manual_seed(5)
    for rows in (24, 7, 0, 13):
        logits = torch.randn(rows, 1000, device=device, generator=g).to(torch.bfloat16)
        drafts = torch.randint(0, 1000, (rows,), device=device, generator=g, dtype=torch.int32)
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, 32), device=device, generator=g,
                                dtype=torch.int32)
        args = (logits, drafts if rows != 7 else None, bitmask, rows)
        if rows == 13:  # from a thread that has made no CUDA call
            worker = threading.Thread(target=fast.write_tensors, args=args)
            worker.start()
            worker.join()
        else:
            fast.write_tensors(*args)
        slow.write_tensors(*args)
        torch.cuda.synchronize()
        assert torch.equal(fast.logits, slow.logits)
        assert torch.equal(fast.draft_token_ids, slow.draft_token_ids)
        assert torch.equal(fast.grammar_bitmask, slow.grammar_bitmask)
    print(f"driver refusals: {fast._copier.refused}")


def test_the_staging_pull_through_the_driver_is_captured_and_reads_the_rows_at_replay():
    from graphshard.plan.staging import Staging

    device = torch.device("cuda", torch.cuda.current_device())
    staging = Staging(16, device)
    assert staging._copier is not None
    host = staging.rows.numpy()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        staging.pull(4)  # warm the views before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            staging.pull(4)
    used = staging._pulls[4][2] // 4
    for value in (7, -3):
        host[:] = value  # after the capture: a replay copies what the rows hold now
        graph.replay()
        torch.cuda.synchronize()
        assert bool((staging.copies[:used] == value).all())
        assert bool((staging.copies[used:] != value).all())
    host[:] = 11
    staging.pull()  # eager, the whole rows
    torch.cuda.synchronize()
    assert bool((staging.copies == 11).all())
    assert staging._copier.refused is None
