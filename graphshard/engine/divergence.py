"""The always-on rank-divergence check: a digest of what must agree, compared inside the step.

The sharded step is only correct while every rank passes the same replicated inputs and holds
the same slot tables. Each step the host writes two digest words into the header of its staged
inputs (`graphshard.plan.staging`), so the step's copy brings them to the device with the
inputs and its kernels read them from device memory (a kernel's read of pinned host memory is a
round trip over the host link). The device's digest is [step, inputs, slots, spare] as int64:
- step: the step number the device fetched;
- inputs: a 32-bit hash of the replicated arrays the device fetched, computed by the kernel
  that sends the digest (`graphshard.transports.digest.inputs_digest`; the host's cost does
  not grow with the batch), plus flags the host sets in the high word (bitmask on, drafts
  given, and "refused": this rank refused the batch for a slot that holds no request here);
- slots: the XOR of per-slot hashes of (slot, params) that `add_request`/`remove_request`
  maintain (`graphshard.engine.agreement.SlotDigest`).
The captured step exchanges the digests (p2p: pushed with the rows; nccl/gloo: appended to the
records of the step's record all-gather, or on their own in a replicate step) and
`graphshard.transports.digest.judge` compares them with rank 0's. Every rank judges the same
digests, so every rank reaches the same verdict; a step whose digests differ writes it into a
pinned host row, which the host reads with one NumPy load once the step has finished.
Nothing syncs with the host and nothing branches on the host inside the step.
"""

from __future__ import annotations

import torch

from graphshard.errors import RankDivergenceError
from graphshard.plan.staging import Staging
from graphshard.transports import digest
from graphshard.transports.digest import VERDICT_WORDS

__all__ = ["DivergenceCheck"]


class DivergenceCheck:
    """One engine's digests and verdicts (host side), and what the transports pass its kernels.

    `begin` runs on the step's host path (no device call, no buffer allocated); `check` reads the
    pinned verdict row of a step once it has finished."""

    def __init__(self, rank: int, world_size: int, device: torch.device, staging: Staging):
        pinned = device.type == "cuda"
        self.rank, self.world_size, self.device = rank, world_size, device
        self.staging = staging  # the step's staged inputs, whose header carries the digest
        # The running step's staged header on the device: int64 [step, num_reqs | bitmask_on,
        # inputs, slots]; its first word is the step number.
        self.header = staging.header
        self.verdicts = torch.full((2, VERDICT_WORDS), -1, dtype=torch.int64, pin_memory=pinned)
        self._verdicts = self.verdicts.numpy()
        # Where the kernels write a verdict: the pinned rows' address, on the device.
        self.verdicts_address = torch.tensor([self.verdicts.data_ptr()],
                                             dtype=torch.int64).to(device)
        self.reported = -1  # the last step whose divergence (or refusal) was raised

    # -- host path ----------------------------------------------------------------------------
    def begin(self, step: int, slots: int, faults, flags: int) -> None:
        """Step `step`'s host part, after `faults.admit(step)`: on CUDA, raise first for a finished
        step (step - 2: admit waited for it) judged divergent that no call has raised for yet,
        so its tokens never pass unnoticed; then seal this step's digest."""
        if not faults.synchronous and step - 2 > self.reported \
                and self._verdicts[step & 1, 0] == step - 2:
            faults.abandon(step)
            self.check(step - 2)
        self.seal(step, slots, flags)

    def settle_refusal(self, step: int, refusal: Exception, wait) -> None:
        """This rank refused step `step` for a slot it holds no request in and ran the step only
        so its peers would learn it: once `wait(step)` returns the step is judged; raise the
        refusal itself where every rank refused alike, else the divergence."""
        wait(step)
        if not self.only_refusals(step):
            self.check(step)
        self.reported = max(self.reported, step)
        raise refusal

    def seal(self, step: int, slots: int, flags: int) -> None:
        """Write step `step`'s host part of the digest into its staging row (step - 2 has
        finished: the row is free); the device hashes the arrays it fetched. Warm-up, capture
        and timing runs stage host parts of 0 (`Staging.write_both`)."""
        self.staging.write_digest(step, flags, slots)

    @staticmethod
    def flags(bitmask_on: bool, drafts: bool, refused: bool = False) -> int:
        return (digest.FLAG_BITMASK_ON if bitmask_on else 0) | \
            (digest.FLAG_DRAFTS if drafts else 0) | (digest.FLAG_REFUSED if refused else 0)

    def check(self, step: int) -> None:
        """Raise `RankDivergenceError` if finished step `step` diverged."""
        if step >= 0 and self._verdicts[step & 1, 0] == step:
            self.reported = max(self.reported, step)
            raise RankDivergenceError(self.describe(step))

    def only_refusals(self, step: int) -> bool:
        """Every rank refused step `step` the same way and nothing else differed."""
        v = self._verdicts[step & 1]
        everyone = (1 << self.world_size) - 1
        return v[0] == step and v[5] == everyone and not (v[2] | v[3] | v[4])

    def describe(self, step: int) -> str:
        """The verdict of step `step` in words, the same on every rank."""
        v = self._verdicts[step & 1]
        parts = [f"ranks {_ranks(v[mask])} differ from rank 0 in their {what}"
                 for mask, what in ((2, "step counts (a rank skipped or repeated a step)"),
                                    (3, "replicated step inputs"),
                                    (4, "active requests and their sampling parameters"))
                 if v[mask]]
        if v[5]:
            parts.append(f"ranks {_ranks(v[5])} refused the batch (a slot in it holds no "
                         "request there)")
        return (f"step {v[6]} (rank 0's count): the ranks diverged: {'; '.join(parts)}; its "
                "results were discarded; every rank must make identical calls")

    # -- the step's end, on padded transports (p2p does this inside its own kernels) ------------
    def seal_on_device(self, out: torch.Tensor) -> None:
        """This rank's digest into `out` (int32, >= DIGEST_INT32 contiguous words), for the
        step's gather to carry (graph-safe)."""
        digest.seal(self.header, self.staging.max_num_reqs, out)

    def judge_gathered(self, gathered: torch.Tensor, rank_stride: int, done=None) -> None:
        """Judge every rank's digest in `gathered` (int32; rank r's at word r * rank_stride) and
        write the verdict (graph-safe). With `done` (a `Staging`) the same kernel then ends the
        step, so judging adds no kernel to a step that ends here."""
        digest.judge_gathered(gathered, rank_stride, self.verdicts_address, self.header,
                              self.world_size, done.done_args() if done is not None else None)


def _ranks(mask) -> list[int]:
    mask = int(mask)
    return [r for r in range(mask.bit_length()) if mask >> r & 1]
