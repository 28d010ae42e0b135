"""A decode loop on graphshard: a tiny decoder whose LM head is vocab-parallel over the TP ranks.

    python examples/decode_loop.py                    # tp = 1, then tp = 2; the tokens must match
    python examples/decode_loop.py --tp 4 --requests 400

(with graphshard importable: `.venv/bin/python` after `make env`, or `PYTHONPATH=.` from the
repository root.)

Without CUDA it runs on gloo processes (Triton's interpreter, emulated graphs: slow, so the sizes
are tiny); with CUDA GPUs on NCCL with CUDA graphs, where it also times the sampling step
against the same loop with an all-gather of the logits and a plain PyTorch sampler.

What to copy into a real loop:
1. Every rank builds the engine from the same config and calls `capture()` once.
2. Each step every rank computes only its own logits columns (`engine.shard_columns()`) straight
   into `engine.inputs.logits[:n]`, and passes that view to `engine.step`.
3. The scheduler's arrays (slots, cu_num_logits, positions) are the same on every rank.
4. `engine.read()`: every result on the host, raising first if a peer failed the step.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from graphshard import Config, Engine, SamplingParams
from graphshard.harness.distributed import spawn

# torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor.
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
HIDDEN = 64
GRID = 64.0  # weights and activations are multiples of 1 / GRID (see TinyDecoder)


def on_grid(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x * GRID) / GRID


class TinyDecoder:
    """A recurrent decoder with random weights: state[slot] <- tanh((embed[token] + state[slot]) @ w),
    logits = state @ head.T. This rank keeps only rows lo..hi-1 of the head (vocab-parallel), the
    head padded with zero rows to the engine's padded vocabulary.

    Weights and activations are multiples of 1/64 in [-1, 1], so every dot product here is exact
    in float32 whatever the summation order: the logits, hence the tokens, are the same at every
    TP size. (A real model's logits differ in their last bits between TP layouts.)"""

    def __init__(self, vocab_size: int, padded_vocab: int, columns: tuple[int, int],
                 max_num_slots: int, device: torch.device, seed: int = 0):
        g = torch.Generator().manual_seed(seed)  # the same weights on every rank

        def weights(*shape):
            return on_grid(torch.rand(*shape, generator=g) * 2 - 1)

        self.embed = weights(vocab_size, HIDDEN).to(device)
        self.w = weights(HIDDEN, HIDDEN).to(device)
        head = torch.zeros(padded_vocab, HIDDEN)
        head[:vocab_size] = weights(vocab_size, HIDDEN)
        lo, hi = columns
        self.head = head[lo:hi].contiguous().to(device)  # [vocab_shard, HIDDEN]
        self.state = torch.zeros(max_num_slots, HIDDEN, device=device)

    def forward(self, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        h = on_grid(torch.tanh((self.embed[tokens] + self.state[slots]) @ self.w))
        self.state[slots] = h
        return h

    def prefill(self, slot: int, tokens: list[int]) -> None:
        self.state[slot] = 0
        for t in tokens:
            self.forward(torch.tensor([slot], device=self.state.device),
                         torch.tensor([t], device=self.state.device))

    def logits(self, h: torch.Tensor, out: torch.Tensor) -> None:
        torch.matmul(h, self.head.T, out=out)  # [n, vocab_shard]: this rank's columns only


@dataclass
class Request:
    rid: int
    arrival: int  # the step it arrives at
    prompt: list[int]
    max_new_tokens: int
    params: SamplingParams
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # the sampled tokens', if asked for

    @property
    def position(self) -> int:
        return len(self.prompt) + len(self.tokens)


KINDS = [dict(temperature=0.0),  # greedy
         dict(temperature=0.8),
         dict(temperature=1.0, top_k=20),
         dict(temperature=0.7, top_p=0.9),
         dict(temperature=0.9, top_k=50, top_p=0.95, min_p=0.05)]


def make_requests(num: int, vocab_size: int, spread: int, max_new_tokens: int,
                  seed: int = 0) -> list[Request]:
    """Requests with mixed parameters, explicit seeds, some with logprobs, arriving over `spread`
    steps with 2 to `max_new_tokens` new tokens each."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        params = SamplingParams(**KINDS[i % len(KINDS)], seed=1000 + i,
                                num_logprobs=3 if i % 3 == 0 else 0)
        prompt = rng.integers(0, vocab_size, size=int(rng.integers(1, 5))).tolist()
        arrival, length = int(rng.integers(0, spread)), int(rng.integers(2, max_new_tokens + 1))
        out.append(Request(i, arrival, prompt, length, params))
    return sorted(out, key=lambda r: (r.arrival, r.rid))


@dataclass(frozen=True)
class Settings:
    vocab_size: int
    max_batch: int
    requests: int
    max_new_tokens: int
    baseline: bool


def config(s: Settings) -> Config:
    buckets = tuple(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < s.max_batch) + (s.max_batch,)
    # No request here is constrained by a grammar: an engine told so launches and compiles only
    # the sampler's variants without bitmask support.
    return Config(vocab_size=s.vocab_size, max_num_reqs=s.max_batch, max_num_slots=2 * s.max_batch,
                  buckets=buckets, num_logprobs=3, grammar_bitmask=False)


def decode_loop(engine: Engine, decoder: TinyDecoder, requests: list[Request], sample) -> list[float]:
    """Run every request to its end; `sample(slots, seq_lens, logits, running)` returns each
    running request's new tokens (and logprobs). Returns the sampling step's times (s)."""
    pending, running = list(requests), []
    free = list(range(engine.config.max_num_slots))
    cu = np.arange(engine.config.max_num_reqs + 1, dtype=np.int32)  # one logits row per request
    device, step, times = engine.device, 0, []
    while pending or running:
        while pending and pending[0].arrival <= step and len(running) < engine.config.max_num_reqs:
            req = pending.pop(0)
            req.slot = free.pop(0)
            engine.add_request(req.slot, req.params)  # the same call on every rank
            decoder.prefill(req.slot, req.prompt[:-1])
            running.append(req)
        step += 1
        if not running:
            continue
        n = len(running)
        slots = np.array([r.slot for r in running], dtype=np.int32)
        last = [r.tokens[-1] if r.tokens else r.prompt[-1] for r in running]
        h = decoder.forward(torch.from_numpy(slots).to(device), torch.tensor(last, device=device))
        logits = engine.inputs.logits[:n]  # write this rank's shard where the engine reads it
        decoder.logits(h, out=logits)
        seq_lens = np.array([r.position for r in running], dtype=np.int32)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # time the sampling step alone
        start = time.perf_counter()
        new = sample(slots, cu[:n + 1], seq_lens, logits, running)
        times.append(time.perf_counter() - start)
        for req, (tokens, logprob) in zip(running, new):
            req.tokens += tokens
            if logprob is not None:
                req.logprobs.append(logprob)
        for req in [r for r in running if len(r.tokens) >= r.max_new_tokens]:
            engine.remove_request(req.slot)
            free.append(req.slot)
            running.remove(req)
    return times


def graphshard_sampler(engine: Engine):
    def sample(slots, cu, seq_lens, logits, running):
        engine.step(slots, cu, seq_lens, logits)
        host = engine.read()  # NumPy arrays; raises instead of returning a failed step's tokens
        return [(host.tokens(j), float(host.sampled_logprob[j, 0]) if r.params.num_logprobs else None)
                for j, r in enumerate(running)]
    return sample


def allgather_torch_sampler(engine: Engine):
    """The loop without graphshard: all-gather every rank's logits columns, then sample every
    row on every rank with plain PyTorch (sort-based top-k/top-p/min-p, one generator)."""
    tp, vocab = engine.tp_size, engine.config.vocab_size
    g = torch.Generator(device=engine.device).manual_seed(0)

    def sample(slots, cu, seq_lens, logits, running):
        n, device = logits.shape[0], logits.device
        if tp > 1:
            parts = torch.empty(tp * n, logits.shape[1], dtype=logits.dtype, device=device)
            all_gather(parts, logits, group=engine.group)
            full = parts.view(tp, n, -1).permute(1, 0, 2).reshape(n, -1)[:, :vocab]
        else:
            full = logits[:, :vocab]
        temperature, top_k, top_p, min_p = (
            torch.tensor([[getattr(r.params, f)] for r in running], dtype=torch.float32, device=device)
            for f in ("temperature", "top_k", "top_p", "min_p"))
        scores, order = (full / temperature.clamp_min(1e-5)).sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=device)[None, :]
        probs = scores.softmax(-1)
        drop = (((top_k > 0) & (ranks >= top_k)) | (probs.cumsum(-1) - probs > top_p)
                | (probs < min_p * probs[:, :1]))
        pick = torch.multinomial(scores.masked_fill(drop, -torch.inf).softmax(-1), 1, generator=g)
        tokens = torch.where(temperature == 0, full.argmax(-1, keepdim=True), order.gather(1, pick))
        logprobs = full.log_softmax(-1).gather(1, tokens)
        tokens, logprobs = tokens.cpu(), logprobs.cpu()
        return [([int(tokens[j])], float(logprobs[j]) if r.params.num_logprobs else None)
                for j, r in enumerate(running)]
    return sample


def run_rank(rank: int, tp: int, s: Settings) -> dict:
    engine = Engine(config(s))  # on the default group that spawn (or torchrun) set up
    engine.capture()

    def fresh():  # the same decoder and requests for each loop
        decoder = TinyDecoder(s.vocab_size, engine.vocab, engine.shard_columns(),
                              engine.config.max_num_slots, engine.device)
        # Arrivals over the first steps: batches fill up, then drain as requests finish.
        spread = max(1, 2 * s.requests // s.max_batch)
        return decoder, make_requests(s.requests, s.vocab_size, spread, s.max_new_tokens)

    decoder, requests = fresh()
    start = time.perf_counter()
    times = decode_loop(engine, decoder, requests, graphshard_sampler(engine))
    elapsed = time.perf_counter() - start
    result = {"tokens": {r.rid: r.tokens for r in requests},
              "logprobs": {r.rid: r.logprobs for r in requests},
              "steps": len(times), "elapsed": elapsed, "step_s": times}
    if s.baseline:
        result["baseline_step_s"] = decode_loop(engine, *fresh(), allgather_torch_sampler(engine))
    engine.close()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, default=2, help="TP size compared against tp = 1")
    parser.add_argument("--requests", type=int, default=None, help="requests to run to their end")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size")
    parser.add_argument("--max-batch", type=int, default=None, help="most requests in one step")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=None,
                        help="also run the all-gather + PyTorch sampler loop (default: with GPUs)")
    args = parser.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus else "gloo"
    if gpus and gpus < args.tp:
        raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs, found {gpus}")
    # Tiny on CPU (the interpreter runs every kernel program in Python); serving-sized on GPUs.
    s = Settings(vocab_size=args.vocab or (128256 if gpus else 200),
                 max_batch=args.max_batch or (64 if gpus else 4),
                 requests=args.requests or (400 if gpus else 8), max_new_tokens=24 if gpus else 8,
                 baseline=bool(gpus) if args.baseline is None else args.baseline)
    print(f"decode loop: {s.requests} requests, vocab {s.vocab_size}, up to {s.max_batch} per step, "
          f"{backend} ({'CUDA graphs' if gpus else 'CPU: Triton interpreter, emulated graphs'})")
    runs = {}
    for tp in sorted({1, args.tp}):
        # spawn sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
        # NVSHMEM_DISABLE_NVLS=1 in each rank (graphshard.harness.distributed.GPU_ENV).
        settings = s if tp == args.tp else dataclasses.replace(s, baseline=False)
        results = spawn(run_rank, tp, settings, backend=backend, timeout_s=1800)
        if any(r["tokens"] != results[0]["tokens"] for r in results):
            raise SystemExit(f"tp={tp}: the ranks returned different tokens")
        runs[tp] = r0 = results[0]
        total = sum(len(t) for t in r0["tokens"].values())
        print(f"tp={tp}: {total} tokens in {r0['steps']} steps, {total / r0['elapsed']:.1f} tokens/s, "
              f"sampling step p50 {np.median(r0['step_s']) * 1e6:.0f} us")
    if args.tp != 1:
        same = runs[1]["tokens"] == runs[args.tp]["tokens"]
        close = all(np.allclose(runs[1]["logprobs"][k], v, atol=1e-4)
                    for k, v in runs[args.tp]["logprobs"].items())
        print(f"tp={args.tp} gives the same tokens as tp=1: {same}; the same logprobs: {close}")
        if not (same and close):
            return 1
    r = runs[args.tp]
    if "baseline_step_s" in r:
        print(f"sampling step at tp={args.tp}, p50: graphshard {np.median(r['step_s']) * 1e6:.0f} us, "
              f"all-gather + PyTorch sampler {np.median(r['baseline_step_s']) * 1e6:.0f} us"
              + ("" if gpus else " (CPU: interpreted kernels; says nothing about GPU speed)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
