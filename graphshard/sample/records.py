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


class HostOutput:
    """A step's results as NumPy arrays, batch order (`SamplerOutput.to_host`, `Engine.read`,
    `unpack_host`): views of `records`, the host copy the caller owns.

    Per request j: `sampled_token_ids[j, :num_sampled[j]]` are its new tokens (accepted drafts,
    then the correction or bonus token); entries past `num_sampled[j]` hold -1. `num_nans[j]`
    counts its rows with a NaN in the real vocabulary (NaN samples as -inf; a row with no
    finite logit samples token 0). With logprobs (K > 0): `topk_ids`/`topk_logprobs` [n, M, K],
    `sampled_logprob`/`sampled_rank` [n, M], for rows < num_sampled[j] and the slot's own
    `num_logprobs` (other entries: id -1, logprob -inf, rank 0); else None.

    A field is split off `records` when first read (then kept): a decode loop that reads only
    the tokens pays for no other view (splitting every field cost ~4 µs a step).
    """

    __slots__ = ("records", "layout", "_views")

    def __init__(self, records: np.ndarray, layout: RecordLayout):
        """`records` [n, layout.width] int32 (not checked: `unpack_host` checks)."""
        self.records = records
        self.layout = layout
        self._views = {}

    def _field(self, name: str):
        views = self._views
        if name not in views:
            views[name] = _view(self.records, self.layout, name, np.float32)
        return views[name]

    @property
    def sampled_token_ids(self) -> np.ndarray:  # [n, M] int32
        return self._field("sampled_token_ids")

    @property
    def num_sampled(self) -> np.ndarray:  # [n] int32
        return self._field("num_sampled")

    @property
    def num_rejected(self) -> np.ndarray:  # [n] int32
        return self._field("num_rejected")

    @property
    def num_nans(self) -> np.ndarray:  # [n] int32
        return self._field("num_nans")

    @property
    def topk_ids(self) -> np.ndarray | None:  # [n, M, K] int32
        return self._field("topk_ids")

    @property
    def topk_logprobs(self) -> np.ndarray | None:  # [n, M, K] float32
        return self._field("topk_logprobs")

    @property
    def sampled_logprob(self) -> np.ndarray | None:  # [n, M] float32
        return self._field("sampled_logprob")

    @property
    def sampled_rank(self) -> np.ndarray | None:  # [n, M] int32
        return self._field("sampled_rank")

    def tokens(self, j: int) -> list[int]:
        """Request j's new tokens (batch position j), in order."""
        return self.sampled_token_ids[j, : self.num_sampled[j]].tolist()

    def __repr__(self) -> str:
        return f"HostOutput(n={self.records.shape[0]}, layout={self.layout})"


def unpack(records: torch.Tensor, layout: RecordLayout,
           tokens: torch.Tensor | None = None) -> SamplerOutput:
    """Split `records` [n, width] int32 into named views (float fields reinterpreted, not
    converted). `tokens`, a contiguous [n, M] copy of the records' token ids that the step keeps
    up to date, is returned as `sampled_token_ids` in place of the strided view (whose `.cpu()`
    for n > 1 first gathers it on the device)."""
    fields = _split(records, layout, torch.int32, torch.float32)
    if tokens is not None:
        shape = fields["sampled_token_ids"].shape
        if tokens.shape != shape or tokens.dtype != torch.int32 \
                or not tokens.is_contiguous() or tokens.device != records.device:
            raise ValueError(f"tokens must be a contiguous int32 [n, M] tensor on "
                             f"{records.device} of shape {tuple(shape)}, "
                             f"got {tokens.dtype} {tuple(tokens.shape)} on {tokens.device}")
        fields["sampled_token_ids"] = tokens
    return SamplerOutput(**fields)


def unpack_host(records: np.ndarray, layout: RecordLayout) -> HostOutput:
    """Split a host copy of records [n, width] int32 (a NumPy array) into named views; the same
    split as `unpack`. For a loop that copies `out.records` into its own pinned buffer."""
    _check(records, layout, np.int32)
    return HostOutput(records, layout)


def _check(records, layout: RecordLayout, int32) -> None:
    if records.dtype != int32 or records.ndim != 2 or records.shape[1] != layout.width:
        raise ValueError(
            f"records must be int32 [n, {layout.width}], got {records.dtype} {tuple(records.shape)}")


FIELDS = ("sampled_token_ids", "num_sampled", "num_rejected", "num_nans", "topk_ids",
          "topk_logprobs", "sampled_logprob", "sampled_rank")


def _split(records, layout: RecordLayout, int32, float32) -> dict:
    """The fields of `records` (a torch tensor or a NumPy array, dtypes `int32`/`float32` of its
    library) as views: every one a slice or a reshape of a slice, nothing copied."""
    _check(records, layout, int32)
    return dict(records=records, **{name: _view(records, layout, name, float32) for name in FIELDS})


def _view(records, layout: RecordLayout, name: str, float32):
    """Field `name` of `records` [n, width] (None for a logprob field when K = 0)."""
    m, k = layout.max_num_logits_per_req, layout.num_logprobs
    if name == "sampled_token_ids":
        return records[:, :m]
    if name in ("num_sampled", "num_rejected", "num_nans"):
        return records[:, getattr(layout, name)]
    if k == 0:
        return None
    n = records.shape[0]
    if name == "topk_ids":
        return records[:, layout.topk_ids:layout.topk_logprobs].reshape(n, m, k)
    if name == "topk_logprobs":
        return records.view(float32)[:, layout.topk_logprobs:layout.sampled_logprob].reshape(n, m, k)
    if name == "sampled_logprob":
        return records.view(float32)[:, layout.sampled_logprob:layout.sampled_rank]
    return records[:, layout.sampled_rank:layout.width]  # sampled_rank
