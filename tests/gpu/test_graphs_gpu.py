"""CUDA graph backend: several buckets in one shared pool, replay equals eager, pool reuse."""

from __future__ import annotations

import gc
import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import pytest  # noqa: E402
import torch  # noqa: E402

from graphshard.graphs import CudaGraphBackend, GraphManager, make_backend  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BUCKETS = (1, 8, 32, 64, 128, 256)
VOCAB = 32000


class SmallStep:
    """Static buffers and a torch-only step whose temporaries scale with the bucket ([B, V])."""

    def __init__(self, device):
        self.logits = torch.zeros(BUCKETS[-1], VOCAB, device=device)
        self.temperature = torch.ones(BUCKETS[-1], device=device)
        self.n = torch.zeros(1, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(BUCKETS[-1], dtype=torch.int64, device=device)
        self.probs_max = torch.zeros(BUCKETS[-1], device=device)

    def register(self, backend):
        backend.register_static_buffers({"logits": self.logits, "temperature": self.temperature,
                                         "n": self.n, "tokens": self.tokens, "probs_max": self.probs_max})

    def step_for(self, bucket):
        def step():
            scaled = self.logits[:bucket] / self.temperature[:bucket, None]  # [B, V]
            probs = torch.softmax(scaled, dim=-1)  # [B, V]
            best, token = probs.max(dim=-1)
            valid = torch.arange(bucket, device=self.n.device) < self.n
            self.tokens[:bucket].copy_(torch.where(valid, token, -1))
            self.probs_max[:bucket].copy_(torch.where(valid, best, 0.0))
        return step


def _fresh_memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_replay_equals_eager_over_random_n():
    device = torch.device("cuda", torch.cuda.current_device())
    s = SmallStep(device)
    backend = CudaGraphBackend(device)
    s.register(backend)
    manager = GraphManager(backend, BUCKETS)
    manager.capture(s.step_for)
    assert manager.keys == sorted(BUCKETS, reverse=True)

    gen = torch.Generator(device=device).manual_seed(0)
    sizes = torch.randint(0, BUCKETS[-1] + 1, (40,), generator=torch.Generator().manual_seed(0))
    for n in sizes.tolist() + [0, 1, BUCKETS[-1]]:
        s.logits.copy_(torch.randn(BUCKETS[-1], VOCAB, device=device, generator=gen))
        s.temperature.copy_(torch.rand(BUCKETS[-1], device=device, generator=gen) + 0.5)
        s.n.fill_(n)
        bucket = manager.bucket_for(n)
        manager.replay(bucket)
        torch.cuda.synchronize()

        probs = torch.softmax(s.logits[:n] / s.temperature[:n, None], dim=-1)
        best, token = probs.max(dim=-1)
        torch.testing.assert_close(s.tokens[:n], token, rtol=0, atol=0)
        torch.testing.assert_close(s.probs_max[:n], best)
        assert (s.tokens[n:bucket] == -1).all()
    stats = manager.stats()
    assert sum(stats.replays.values()) == 43
    assert stats.graph_memory_bytes is not None and stats.graph_memory_bytes > 0


def test_shared_pool_memory_close_to_largest_graph_alone():
    device = torch.device("cuda", torch.cuda.current_device())
    s = SmallStep(device)

    _fresh_memory()
    alone = CudaGraphBackend(device)
    GraphManager(alone, BUCKETS).capture(s.step_for, keys=[BUCKETS[-1]])
    largest_alone = alone.memory_bytes()
    del alone
    _fresh_memory()

    shared = CudaGraphBackend(device)
    GraphManager(shared, BUCKETS).capture(s.step_for)
    all_graphs = shared.memory_bytes()

    # Temporaries of a [256, 32000] fp32 step are ~32 MB each: the pool must grow measurably.
    assert largest_alone >= 32 * 2**20
    assert all_graphs <= 1.25 * largest_alone, (all_graphs, largest_alone)


def test_auto_backend_and_unknown_key():
    backend = make_backend("auto", "cuda")
    assert isinstance(backend, CudaGraphBackend)
    with pytest.raises(KeyError, match="no graph captured"):
        backend.replay(3)
