"""The engine's static input buffers and the one host-to-device copy that fills them per step.

`tensor_error` checks a rank's own tensors against the buffers they are copied into; the engine
calls it (and checks the replicated inputs) before any `write_*` method, so those only copy.

The replicated integer inputs (n, slots, cu_num_logits, seq_lens, the bitmask flag) are packed
into one int32 buffer. The host writes them into a pinned staging buffer and the captured step
itself copies it in (`fetch`, the graph's first node), so issuing a step costs no copy call. The
staging buffer is rewritten only after the step that last read it has fetched it.
"""

from __future__ import annotations

import numpy as np
import torch

from graphshard.validate import InvalidBatchError


class StepInputs:
    """Device buffers at the padded maximum, sliced views for each input."""

    def __init__(self, *, max_num_reqs: int, max_num_logits_per_req: int, vocab_shard: int,
                 bitmask_words: int, logits_dtype: torch.dtype, device: torch.device,
                 real_bitmask_words: int | None = None):
        """`real_bitmask_words` (<= `bitmask_words`) is a bitmask width also accepted: one that
        covers the real vocabulary but not the padding."""
        n, rows = max_num_reqs, max_num_reqs * max_num_logits_per_req
        self.max_num_reqs, self.max_num_rows = n, rows
        self.max_num_logits_per_req = max_num_logits_per_req
        self.bitmask_widths = (bitmask_words, real_bitmask_words or bitmask_words)
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

    # -- checks of this rank's own tensors ----------------------------------------------------------
    def tensor_error(self, logits, drafts, bitmask, num_logits: int) -> Exception | None:
        """What is wrong with a step's logits, drafts or bitmask (the exception to raise), or None."""
        try:
            self._check_logits(logits, num_logits)
            if drafts is not None:
                if self.max_num_logits_per_req == 1:
                    raise InvalidBatchError("draft_token_ids given but max_num_logits_per_req is 1")
                _check_int32("draft_token_ids", drafts, (num_logits,), self.device)
                _check_not_misplaced("draft_token_ids", drafts, self.draft_token_ids)
            if bitmask is not None:
                # DESIGN sizes it by the padded vocabulary; a width covering the real one is
                # accepted too.
                width = bitmask.shape[-1] if isinstance(bitmask, torch.Tensor) and bitmask.dim() == 2 else -1
                width = width if width in self.bitmask_widths else self.bitmask_widths[0]
                _check_int32("grammar_bitmask", bitmask, (num_logits, width), self.device)
                _check_not_misplaced("grammar_bitmask", bitmask, self.grammar_bitmask)
        except (InvalidBatchError, TypeError) as e:
            return e
        return None

    def _check_logits(self, logits, num_logits: int) -> None:
        vocab_shard, dtype = self.logits.shape[1], self.logits.dtype
        if not isinstance(logits, torch.Tensor):
            raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.dim() != 2 or logits.shape != (num_logits, vocab_shard):
            raise InvalidBatchError(f"logits must be [{num_logits}, {vocab_shard}] (rows x this "
                                    f"rank's vocab shard), got {tuple(logits.shape)}")
        if logits.dtype != dtype:
            raise TypeError(f"logits must be {dtype} (config logits_dtype), got {logits.dtype}")
        if logits.device != self.device:
            raise InvalidBatchError(f"logits is on {logits.device}, the engine runs on {self.device}")
        if logits.stride(-1) != 1:
            raise InvalidBatchError("logits rows must be contiguous (last-dim stride 1)")
        _check_not_misplaced("logits", logits, self.logits)


def _check_not_misplaced(name: str, value: torch.Tensor, static: torch.Tensor) -> None:
    """A tensor inside a static input buffer must be that buffer's leading rows (the zero-copy
    path); any other view would be copied onto itself."""
    if value.numel() == 0 or value.untyped_storage().data_ptr() != static.untyped_storage().data_ptr():
        return
    if value.data_ptr() != static.data_ptr() or value.stride() != static[: value.shape[0]].stride():
        raise InvalidBatchError(f"{name} is a view into the engine's static {name} buffer other "
                                f"than its leading rows; pass engine.inputs' buffer[:num_logits]")


def _check_int32(name: str, value, shape: tuple, device: torch.device) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {value.dtype}")
    if tuple(value.shape) != shape:
        raise InvalidBatchError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if value.device != device:
        raise InvalidBatchError(f"{name} is on {value.device}, the engine runs on {device}")
