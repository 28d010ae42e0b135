"""The engine's static input buffers and the one host-to-device copy that fills them per step.

The engine validates every input before calling a `write_*` method, so these only copy.

The replicated integer inputs (n, slots, cu_num_logits, seq_lens, the bitmask flag) are packed
into one int32 buffer. The host writes them into a pinned staging buffer and the captured step
itself copies it in (`fetch`, the graph's first node), so issuing a step costs no copy call. The
staging buffer is rewritten only after the step that last read it has fetched it.
"""

from __future__ import annotations

import numpy as np
import torch


class StepInputs:
    """Device buffers at the padded maximum, sliced views for each input."""

    def __init__(self, *, max_num_reqs: int, max_num_logits_per_req: int, vocab_shard: int,
                 bitmask_words: int, logits_dtype: torch.dtype, device: torch.device):
        n, rows = max_num_reqs, max_num_reqs * max_num_logits_per_req
        self.max_num_reqs, self.max_num_rows = n, rows
        self.device = device
        # [num_reqs | idx_mapping N | cu_num_logits N+1 | seq_lens N | bitmask_on]
        self._sizes = (1, n, n + 1, n, 1)
        width = sum(self._sizes)
        self.meta = torch.zeros(width, dtype=torch.int32, device=device)
        self.num_reqs, self.idx_mapping, self.cu_num_logits, self.seq_lens, self.bitmask_on = \
            torch.split(self.meta, self._sizes)
        self.logits = torch.zeros(rows, vocab_shard, dtype=logits_dtype, device=device)  # [rows, V/T]
        self.draft_token_ids = torch.full((rows,), -1, dtype=torch.int32, device=device)
        self.grammar_bitmask = torch.full((rows, bitmask_words), -1, dtype=torch.int32, device=device)
        pinned = device.type == "cuda"
        self.staging = torch.zeros(width, dtype=torch.int32, pin_memory=pinned)  # host side of meta
        self._host_views = np.split(self.staging.numpy(), np.cumsum(self._sizes)[:-1])
        # Recorded after each issued step: once it has fired, that step fetched the staging buffer.
        self._fetched = torch.cuda.Event() if pinned else None
        self._pending = False

    def write_meta(self, idx: np.ndarray, cu: np.ndarray, seq_lens: np.ndarray, bitmask_on: bool):
        """Stage the replicated host arrays for the next step's `fetch` (no device call)."""
        if self._pending:
            self._fetched.synchronize()  # only waits while the previous step has not run yet
            self._pending = False
        host = self._host_views
        n = idx.shape[0]
        # Entries past n are never read (the plan kernel and the sampler mask by n), so only the
        # live prefix is written.
        host[0][0] = n
        host[1][:n] = idx
        host[2][:n + 1] = cu
        host[3][:n] = seq_lens
        host[4][0] = bitmask_on

    def fetch(self) -> None:
        """The step's first operation: copy the staged inputs to the device (graph-safe)."""
        self.meta.copy_(self.staging, non_blocking=True)

    def mark_issued(self) -> None:
        """Call after issuing a step that fetched: guards the staging buffer until it has run."""
        if self._fetched is not None:
            self._fetched.record()
            self._pending = True

    def issued_event(self) -> torch.cuda.Event | None:
        """The event recorded after the last issued step, or None (CPU: steps run synchronously)."""
        return self._fetched if self._pending else None

    def write_logits(self, logits: torch.Tensor, num_logits: int) -> None:
        """Copy the caller's shard in, unless the decode loop wrote straight into `self.logits`."""
        if num_logits and logits.data_ptr() == self.logits.data_ptr():
            return
        self.logits[:num_logits].copy_(logits, non_blocking=True)

    def write_drafts(self, drafts: torch.Tensor | None, num_logits: int) -> None:
        if drafts is None:
            self.draft_token_ids[:num_logits].fill_(-1)  # -1 never equals a sample: nothing accepted
        else:
            self.draft_token_ids[:num_logits].copy_(drafts, non_blocking=True)

    def write_bitmask(self, bitmask: torch.Tensor | None, num_logits: int) -> None:
        if bitmask is not None:
            self.grammar_bitmask[:num_logits, : bitmask.shape[1]].copy_(bitmask, non_blocking=True)
