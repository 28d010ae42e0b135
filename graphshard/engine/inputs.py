"""The engine's static input buffers: what the host stages per step and what it copies in.

`check_supported` refuses drafts or a bitmask the config has no room for (a replicated check);
`tensor_error` checks a rank's own tensors against the buffers they are copied into;
`tensors_fit` is the cheap form of both for the common case (True only where they would find
nothing). The engine calls them (and checks the replicated inputs) before any `stage` or
`write_tensors`, so those only copy.

The replicated integer inputs go through `graphshard.plan.staging`: one write into a pinned,
double-buffered host row per step, fetched by the captured step itself.
"""

from __future__ import annotations

import math
import operator

import torch

from graphshard.plan.staging import Staging
from graphshard.runtime.memcpy import device_copier
from graphshard.errors import InvalidBatchError, InvalidTypeError


class StepInputs:
    """Device buffers at the padded maximum, sliced views for each input."""

    def __init__(self, *, max_num_reqs: int, max_num_logits_per_req: int, vocab_shard: int,
                 bitmask_words: int, logits_dtype: torch.dtype, device: torch.device,
                 real_bitmask_words: int | None = None, grammar_bitmask: bool = True):
        """`real_bitmask_words` (<= `bitmask_words`) is a bitmask width also accepted: one that
        covers the real vocabulary but not the padding. Without `grammar_bitmask` there is no
        bitmask buffer (`self.grammar_bitmask` is None) and a step's bitmask is refused."""
        n, rows = max_num_reqs, max_num_reqs * max_num_logits_per_req
        self.max_num_reqs, self.max_num_rows = n, rows
        self.max_num_logits_per_req = max_num_logits_per_req
        self.bitmask_widths = (bitmask_words, real_bitmask_words or bitmask_words)
        self.device = device
        self.staged = Staging(n, device)
        self.meta, self.staging = self.staged.meta, self.staged.rows
        self.num_reqs, self.bitmask_on, self.idx_mapping, self.cu_num_logits, self.seq_lens = \
            self.staged.views()
        # stage(step, idx, cu, lens, bitmask_on): step `step`'s replicated arrays into its pinned
        # row, no device call (bound directly: this runs every step).
        self.stage = self.staged.write
        # One allocation holds all three, so a step's tensor that is not a buffer's leading rows
        # must lie wholly outside one address range (`_block`): one test per tensor per step.
        specs = {"logits": ((rows, vocab_shard), logits_dtype),  # [rows, V/T]
                 "drafts": ((rows,), torch.int32),  # [rows]
                 "bitmask": ((rows, bitmask_words), torch.int32)}  # [rows, words]
        if not grammar_bitmask:
            del specs["bitmask"]
        buffers, self._block = _carve(specs, device)
        self.logits = buffers["logits"].zero_()
        self.draft_token_ids = buffers["drafts"].fill_(-1)
        self.grammar_bitmask = buffers["bitmask"].fill_(-1) if grammar_bitmask else None
        # Rows of draft_token_ids written since they last held -1 (a step without drafts
        # resets only those, and only once).
        self._dirty_draft_rows = 0
        self._views: dict[tuple, torch.Tensor] = {}  # `_view`'s
        self._buffers = buffers  # by `_SHOWN`'s keys; `_view`'s and the exact check's
        self._ptrs = {name: t.data_ptr() for name, t in buffers.items()}
        self._on_device = _device_test(device)
        self._logits_ptr = self._ptrs["logits"]
        self._dtype, self._vocab_shard = logits_dtype, vocab_shard
        self._row_bytes = vocab_shard * self.logits.element_size()
        self._copier = device_copier(device)  # None off CUDA: `copy_`
        self._row_strides = (vocab_shard, 1)  # contiguous rows; the leading rows of self.logits

    # -- per step ---------------------------------------------------------------------------------
    def stage_placeholder(self, step: int, idx, cu, lens) -> None:
        """A batch every warm-up, capture or timing run may fetch, whichever row it reads."""
        self.staged.write_both(step, idx, cu, lens, False)

    def fetch(self, max_reqs: int | None = None, pdl_next: bool = False) -> None:
        """The step's first operation: the staged inputs of a step of at most `max_reqs`
        requests (its bucket) into `meta` (graph-safe). `pdl_next`: the next kernel is a
        programmatic dependent (`Staging.fetch`)."""
        self.staged.fetch(max_reqs, pdl_next)

    def is_zero_copy(self, logits: torch.Tensor | None, num_logits: int) -> bool:
        """Whether the decode loop wrote this step's logits straight into `self.logits` (None:
        it says so without a view)."""
        return logits is None or (num_logits > 0 and logits.data_ptr() == self._logits_ptr)

    def write_tensors(self, logits: torch.Tensor, drafts, bitmask, num_logits: int) -> None:
        """Copy this rank's tensors in (stream-ordered, so a step in flight still reads its own).
        On CUDA each contiguous one goes through the driver (`runtime.memcpy`): its bytes are
        the leading bytes of its buffer (a bitmask's where it is as wide as the buffer's rows).
        The others, and a copy the driver refuses (a thread without the device's context
        current, say), take `copy_`, which raises what is wrong, if anything."""
        copy, ptrs = self._copier or _no_driver, self._ptrs
        if not self.is_zero_copy(logits, num_logits):
            if not (logits.is_contiguous()
                    and copy(self._logits_ptr, logits.data_ptr(), num_logits * self._row_bytes)):
                # Detached: a grad-tracking shard must not give the static buffer a history.
                self._view("logits", num_logits).copy_(logits.detach(), non_blocking=True)
        if self.max_num_logits_per_req > 1:
            if drafts is not None and drafts.is_contiguous() \
                    and copy(ptrs["drafts"], drafts.data_ptr(), 4 * num_logits):
                self._dirty_draft_rows = max(self._dirty_draft_rows, num_logits)
            else:
                self._write_drafts(drafts, num_logits)
        if bitmask is not None:
            if not (bitmask.shape[1] == self.bitmask_widths[0] and bitmask.is_contiguous()
                    and copy(ptrs["bitmask"], bitmask.data_ptr(), 4 * bitmask.numel())):
                self._view("bitmask", num_logits, bitmask.shape[1]).copy_(bitmask, non_blocking=True)

    def _view(self, name: str, num_logits: int, width: int | None = None) -> torch.Tensor:
        """The leading `num_logits` rows of a buffer (and `width` words of the bitmask's), made
        once per size: slicing costs microseconds a step where the loop runs cold."""
        key = (name, num_logits, width)
        view = self._views.get(key)
        if view is None:
            buf = self._buffers[name]
            view = self._views[key] = buf[:num_logits] if width is None \
                else buf[:num_logits, :width]
        return view

    def _write_drafts(self, drafts: torch.Tensor | None, num_logits: int) -> None:
        if drafts is not None:
            self._view("drafts", num_logits).copy_(drafts, non_blocking=True)
            self._dirty_draft_rows = max(self._dirty_draft_rows, num_logits)
        elif self._dirty_draft_rows:
            # -1 never equals a sample: nothing accepted.
            self.draft_token_ids[:self._dirty_draft_rows].fill_(-1)
            self._dirty_draft_rows = 0

    def tensors_fit(self, logits, drafts, bitmask, num_logits: int) -> bool:
        """True only where `check_supported` and `tensor_error` find nothing; False sends the
        caller to them."""
        if logits is not None and not self._logits_fit(logits, num_logits):
            return False
        if drafts is None and bitmask is None:
            return True
        if drafts is not None and (self.max_num_logits_per_req == 1
                                   or not self._int32_fits(drafts, num_logits, 1)):
            return False
        return bitmask is None or (self.grammar_bitmask is not None
                                   and self._int32_fits(bitmask, num_logits, 2))

    def _logits_fit(self, logits, num_logits: int) -> bool:
        # Dense first: a sparse or mkldnn tensor has no strides or data pointer to test.
        if not (isinstance(logits, torch.Tensor) and logits.layout is torch.strided
                and logits.dtype is self._dtype
                and logits.shape == (num_logits, self._vocab_shard)
                and logits.stride() == self._row_strides and self._on_device(logits)):
            return False
        # Any other tensor over the static buffers' memory would be copied onto it.
        p, (lo, hi) = logits.data_ptr(), self._block
        return p == self._logits_ptr or not lo - num_logits * self._row_bytes < p < hi

    def _int32_fits(self, t, num_logits: int, dims: int) -> bool:
        if not (isinstance(t, torch.Tensor) and t.layout is torch.strided
                and t.dtype is torch.int32 and t.dim() == dims
                and t.shape[0] == num_logits and self._on_device(t)):
            return False
        if dims == 2 and t.shape[1] not in self.bitmask_widths:
            return False
        # Clear of the static buffers (their leading rows included: the exact check accepts those).
        lo, hi = self._block
        n = t.numel()
        return n == 0 or (t.is_contiguous() and not lo - 4 * n < t.data_ptr() < hi)

    # -- checks of this rank's own tensors ----------------------------------------------------------
    def check_supported(self, drafts, bitmask) -> None:
        """Raise InvalidBatchError for drafts or a bitmask the config leaves no room for. Whether
        a step has them is the same on every rank (the divergence check compares it), so this
        is a replicated check, unlike `tensor_error`, which it precedes."""
        if drafts is not None and self.max_num_logits_per_req == 1:
            raise InvalidBatchError("draft_token_ids given but max_num_logits_per_req is 1")
        if bitmask is not None and self.grammar_bitmask is None:
            raise InvalidBatchError("grammar_bitmask given but the config has grammar_bitmask = false")

    def tensor_error(self, logits, drafts, bitmask, num_logits: int) -> Exception | None:
        """What is wrong with a step's logits, drafts or bitmask (the exception to raise), or None;
        after `check_supported`."""
        try:
            if logits is not None:  # None: already in `self.logits`
                self._check_logits(logits, num_logits)
            if drafts is not None:
                _check_int32("draft_token_ids", drafts, (num_logits,), self.device)
                self._check_not_misplaced("drafts", drafts)
            if bitmask is not None:
                # Sized by the padded vocabulary (docs/design.md, "What a step computes"); a
                # width covering the real one is accepted too.
                width = bitmask.shape[-1] if isinstance(bitmask, torch.Tensor) \
                    and not bitmask.is_nested and bitmask.dim() == 2 else -1
                width = width if width in self.bitmask_widths else self.bitmask_widths[0]
                _check_int32("grammar_bitmask", bitmask, (num_logits, width), self.device)
                self._check_not_misplaced("bitmask", bitmask)
        except (InvalidBatchError, TypeError) as e:
            return e
        return None

    def _check_logits(self, logits, num_logits: int) -> None:
        vocab_shard, dtype = self.logits.shape[1], self.logits.dtype
        if not isinstance(logits, torch.Tensor):
            raise InvalidTypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        _check_dense("logits", logits)
        if logits.dim() != 2 or logits.shape != (num_logits, vocab_shard):
            raise InvalidBatchError(f"logits must be [{num_logits}, {vocab_shard}] (rows x this "
                                    f"rank's vocab shard), got {tuple(logits.shape)}")
        if logits.dtype != dtype:
            raise InvalidTypeError(f"logits must be {dtype} (config logits_dtype), got {logits.dtype}")
        if logits.device != self.device:
            raise InvalidBatchError(f"logits is on {logits.device}, the engine runs on {self.device}")
        if logits.stride(-1) != 1:
            raise InvalidBatchError("logits rows must be contiguous (last-dim stride 1)")
        self._check_not_misplaced("logits", logits)

    def _check_not_misplaced(self, key: str, value: torch.Tensor) -> None:
        """A tensor whose bytes overlap a static input buffer must be its own buffer's leading rows
        (the zero-copy path); any other would be copied onto that buffer. Addresses are compared,
        not storage objects: a second storage over the same memory (a NumPy or DLPack round trip)
        aliases too."""
        if value.numel() == 0:
            return
        start = value.data_ptr()
        end = start + (sum((n - 1) * s for n, s in zip(value.shape, value.stride())) + 1) \
            * value.element_size()
        name = _SHOWN[key]
        for other, static in self._buffers.items():
            if end <= static.data_ptr() or _end(static) <= start:
                continue
            if other != key:
                raise InvalidBatchError(f"{name} overlaps the engine's static {_SHOWN[other]} "
                                        f"buffer (the step's copies into its buffers would "
                                        f"overwrite it); pass a tensor of its own")
            if start != static.data_ptr() or value.stride() != static[: value.shape[0]].stride():
                raise InvalidBatchError(f"{name} overlaps the engine's static {name} buffer but is "
                                        f"not its leading rows (it would be copied onto itself); "
                                        f"pass engine.inputs' buffer[:num_logits]")


# The buffers' names in messages: the `step` arguments they receive.
_SHOWN = {"logits": "logits", "drafts": "draft_token_ids", "bitmask": "grammar_bitmask"}


def _check_dense(name: str, value: torch.Tensor) -> None:
    """Refuse a tensor without plain strided memory (sparse, mkldnn, nested): the copy-in and
    the address checks need a data pointer and strides."""
    if value.layout is not torch.strided:
        raise InvalidTypeError(f"{name} must be a dense (strided) tensor, got {value.layout}")
    if value.is_nested:
        raise InvalidTypeError(f"{name} must be a dense (strided) tensor, got a nested tensor")


def _check_int32(name: str, value, shape: tuple, device: torch.device) -> None:
    if not isinstance(value, torch.Tensor):
        raise InvalidTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    _check_dense(name, value)
    if value.dtype != torch.int32:
        raise InvalidTypeError(f"{name} must be int32, got {value.dtype}")
    if tuple(value.shape) != shape:
        raise InvalidBatchError(f"{name} must have shape {list(shape)}, got {list(value.shape)}")
    if value.device != device:
        raise InvalidBatchError(f"{name} is on {value.device}, the engine runs on {device}")


def _no_driver(dst_ptr: int, src_ptr: int, nbytes: int) -> bool:
    """`write_tensors`' copier off CUDA: it refuses every copy, so each takes `copy_`."""
    return False


def _carve(specs: dict, device: torch.device) -> tuple[dict, tuple[int, int]]:
    """Tensors of the given (shape, dtype) in one allocation, each at a 256-byte boundary, and the
    allocation's [first, past-the-end) byte addresses."""
    spans, total = {}, 0
    for name, (shape, dtype) in specs.items():
        start = -(-total // 256) * 256
        total = start + math.prod(shape) * dtype.itemsize
        spans[name] = slice(start, total)
    block = torch.empty(total, dtype=torch.uint8, device=device)
    tensors = {name: block[spans[name]].view(dtype).view(shape)
               for name, (shape, dtype) in specs.items()}
    return tensors, (block.data_ptr(), block.data_ptr() + total)


def _end(t: torch.Tensor) -> int:
    """The past-the-end byte address of a contiguous static buffer."""
    return t.data_ptr() + t.numel() * t.element_size()


def _device_test(device: torch.device):
    """A cheap `t.device == device` (building a torch.device per call costs more)."""
    if device.type == "cuda":
        index = device.index
        return lambda t: t.is_cuda and t.get_device() == index
    if device.type == "cpu":
        return operator.attrgetter("is_cpu")
    return lambda t: t.device == device
