"""Packed per-request results: one int32 record per request, gathered across ranks in one collective.

Layout of a record (M = max logits rows per request, K = logprobs per row):

| field            | offset          | count | type                     |
| ---------------- | --------------- | ----- | ------------------------ |
| sampled tokens   | 0               | M     | int32, -1 past num_sampled |
| num_sampled      | M               | 1     | int32                    |
| num_rejected     | M + 1           | 1     | int32                    |
| num_nans         | M + 2           | 1     | int32                    |
| top-K ids        | M + 3           | M*K   | int32, row-major [M, K]  |
| top-K logprobs   | M + 3 + M*K     | M*K   | float32 bits             |
| sampled logprob  | M + 3 + 2*M*K   | M     | float32 bits             |
| sampled rank     | M + 3 + 2*M*K+M | M     | int32 (1 = most likely)  |

The logprob fields exist only when K > 0. Float fields are stored as their bit pattern so a
record moves as plain int32 through every transport.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class RecordLayout:
    max_num_logits_per_req: int  # M
    num_logprobs: int  # K

    @property
    def num_sampled(self) -> int:
        return self.max_num_logits_per_req

    @property
    def num_rejected(self) -> int:
        return self.max_num_logits_per_req + 1

    @property
    def num_nans(self) -> int:
        return self.max_num_logits_per_req + 2

    @property
    def topk_ids(self) -> int:
        return self.max_num_logits_per_req + 3

    @property
    def topk_logprobs(self) -> int:
        return self.topk_ids + self.max_num_logits_per_req * self.num_logprobs

    @property
    def sampled_logprob(self) -> int:
        return self.topk_logprobs + self.max_num_logits_per_req * self.num_logprobs

    @property
    def sampled_rank(self) -> int:
        return self.sampled_logprob + self.max_num_logits_per_req

    @property
    def width(self) -> int:
        if self.num_logprobs == 0:
            return self.max_num_logits_per_req + 3
        return self.sampled_rank + self.max_num_logits_per_req


@dataclass(frozen=True)
class SamplerOutput:
    """Views into a [n, width] record buffer, batch order. Nothing here is copied.

    What `Engine.step` returns: views of static buffers that the next step overwrites. `to_host()`
    reads every result with one copy (of `records`, the contiguous block itself) instead of one
    per field. The logprob fields are None when the layout has no logprobs (K = 0).
    """

    records: torch.Tensor  # [n, width] int32
    sampled_token_ids: torch.Tensor  # [n, M] int32
    num_sampled: torch.Tensor  # [n] int32
    num_rejected: torch.Tensor  # [n] int32
    num_nans: torch.Tensor  # [n] int32
    topk_ids: torch.Tensor | None  # [n, M, K] int32
    topk_logprobs: torch.Tensor | None  # [n, M, K] float32
    sampled_logprob: torch.Tensor | None  # [n, M] float32
    sampled_rank: torch.Tensor | None  # [n, M] int32

    @property
    def layout(self) -> RecordLayout:
        """The record layout these views split (M and K read off their shapes)."""
        k = self.topk_ids.shape[2] if self.topk_ids is not None else 0
        return RecordLayout(self.sampled_token_ids.shape[1], k)

    def to_host(self) -> "HostOutput":
        """One copy of the records to host memory (waiting for the step on CUDA), split into named
        NumPy arrays. The copy is the caller's: later steps do not change it."""
        host = self.records.detach().to("cpu", copy=True)  # a copy on CPU too: the buffer is static
        return unpack_host(host.numpy(), self.layout)


@dataclass(frozen=True)
class HostOutput:
    """A step's results as NumPy arrays, batch order (`SamplerOutput.to_host`, `unpack_host`).

    Per request j: `sampled_token_ids[j, :num_sampled[j]]` are its new tokens (accepted drafts,
    then the correction or bonus token); entries past `num_sampled[j]` hold -1. `num_nans[j]`
    counts its rows with a NaN in the real vocabulary (NaN samples as -inf; a row with no
    finite logit samples token 0). With logprobs (K > 0): `topk_ids`/`topk_logprobs` [n, M, K],
    `sampled_logprob`/`sampled_rank` [n, M], for rows < num_sampled[j] and the slot's own
    `num_logprobs` (other entries: id -1, logprob -inf, rank 0); else None.
    """

    records: np.ndarray = field(repr=False)  # [n, width] int32, the host copy the fields view
    sampled_token_ids: np.ndarray  # [n, M] int32
    num_sampled: np.ndarray  # [n] int32
    num_rejected: np.ndarray  # [n] int32
    num_nans: np.ndarray  # [n] int32
    topk_ids: np.ndarray | None  # [n, M, K] int32
    topk_logprobs: np.ndarray | None  # [n, M, K] float32
    sampled_logprob: np.ndarray | None  # [n, M] float32
    sampled_rank: np.ndarray | None  # [n, M] int32

    def tokens(self, j: int) -> list[int]:
        """Request j's new tokens (batch position j), in order."""
        return self.sampled_token_ids[j, : self.num_sampled[j]].tolist()


def unpack(records: torch.Tensor, layout: RecordLayout) -> SamplerOutput:
    """Split `records` [n, width] int32 into named views (float fields reinterpreted, not converted)."""
    return SamplerOutput(**_split(records, layout, torch.int32, torch.float32))


def unpack_host(records: np.ndarray, layout: RecordLayout) -> HostOutput:
    """Split a host copy of records [n, width] int32 (a NumPy array) into named views; the same
    split as `unpack`. For a loop that copies `out.records` into its own pinned buffer."""
    return HostOutput(**_split(records, layout, np.int32, np.float32))


def _split(records, layout: RecordLayout, int32, float32) -> dict:
    """The fields of `records` (a torch tensor or a NumPy array, dtypes `int32`/`float32` of its
    library) as views: every one a slice or a reshape of a slice, nothing copied."""
    if records.dtype != int32 or records.ndim != 2 or records.shape[1] != layout.width:
        raise ValueError(
            f"records must be int32 [n, {layout.width}], got {records.dtype} {tuple(records.shape)}")
    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    n = records.shape[0]
    out = dict(records=records, sampled_token_ids=records[:, :m],
               num_sampled=records[:, layout.num_sampled], num_rejected=records[:, layout.num_rejected],
               num_nans=records[:, layout.num_nans],
               topk_ids=None, topk_logprobs=None, sampled_logprob=None, sampled_rank=None)
    if k > 0:
        as_float = records.view(float32)
        out["topk_ids"] = records[:, layout.topk_ids:layout.topk_logprobs].reshape(n, m, k)
        out["topk_logprobs"] = as_float[:, layout.topk_logprobs:layout.sampled_logprob].reshape(n, m, k)
        out["sampled_logprob"] = as_float[:, layout.sampled_logprob:layout.sampled_rank]
        out["sampled_rank"] = records[:, layout.sampled_rank:layout.width]
    return out
