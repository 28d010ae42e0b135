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

from dataclasses import dataclass

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

    `records` is the contiguous block itself: a decode loop reads every result with one copy
    (`unpack(out.records.cpu(), layout)`) instead of one per field.
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


def unpack(records: torch.Tensor, layout: RecordLayout) -> SamplerOutput:
    """Split `records` [n, width] int32 into named views (float fields reinterpreted, not converted)."""
    if records.dtype != torch.int32 or records.dim() != 2 or records.shape[1] != layout.width:
        raise ValueError(
            f"records must be int32 [n, {layout.width}], got {records.dtype} {tuple(records.shape)}")
    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    n = records.shape[0]
    out = dict(
        records=records,
        sampled_token_ids=records[:, :m],
        num_sampled=records[:, layout.num_sampled],
        num_rejected=records[:, layout.num_rejected],
        num_nans=records[:, layout.num_nans],
        topk_ids=None, topk_logprobs=None, sampled_logprob=None, sampled_rank=None,
    )
    if k > 0:
        as_float = records.view(torch.float32)
        out["topk_ids"] = records[:, layout.topk_ids:layout.topk_logprobs].view(n, m, k)
        out["topk_logprobs"] = as_float[:, layout.topk_logprobs:layout.sampled_logprob].view(n, m, k)
        out["sampled_logprob"] = as_float[:, layout.sampled_logprob:layout.sampled_rank]
        out["sampled_rank"] = records[:, layout.sampled_rank:layout.width]
    return SamplerOutput(**out)
