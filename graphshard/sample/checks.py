"""The sampler launcher's checks of its arguments: types, dtypes, shapes, strides and devices,
each failure a TypeError or ValueError that names the argument, raised before anything
launches."""

from __future__ import annotations

import torch

from graphshard import config
from graphshard.runtime.launch import check_int32_vector
from graphshard.sample.params import SlotTables
from graphshard.sample.records import RecordLayout
from graphshard.sample.workspace import SamplerWorkspace

LOGITS_DTYPES = tuple(getattr(torch, name) for name in config.LOGITS_DTYPES)
_DTYPE_NAMES = ", ".join(config.LOGITS_DTYPES[:-1]) + " or " + config.LOGITS_DTYPES[-1]


def check_logits(logits, vocab_size, max_num_reqs, layout) -> None:
    """The logits [rows, padded_vocab], the real vocabulary within them, the static request
    bound and the record layout."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits must be {_DTYPE_NAMES}, got {logits.dtype}")
    if logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"logits must be 2-D [rows, padded_vocab] with a contiguous last dim, "
                         f"got shape {tuple(logits.shape)} strides {logits.stride()}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) \
            or not (1 <= vocab_size <= logits.shape[1]):
        raise ValueError(f"vocab_size must be an int in [1, {logits.shape[1]}], got {vocab_size!r}")
    if isinstance(max_num_reqs, bool) or not isinstance(max_num_reqs, int) or max_num_reqs < 0:
        raise ValueError(f"max_num_reqs must be an int >= 0, got {max_num_reqs!r}")
    if not isinstance(layout, RecordLayout):
        raise TypeError(f"layout must be a RecordLayout, got {type(layout).__name__}")


def check_tables(tables: SlotTables, device: torch.device) -> None:
    if not isinstance(tables, SlotTables):
        raise TypeError(f"tables must be a SlotTables, got {type(tables).__name__}")
    if tables.packed.device != device:
        raise ValueError(f"tables are on {tables.packed.device}, logits on {device}")
    if not tables.packed.is_contiguous():
        raise ValueError("tables.packed must be contiguous")


def check_workspace(workspace: SamplerWorkspace, vocab_size: int, layout: RecordLayout,
                    max_num_reqs: int, device: torch.device) -> None:
    if not isinstance(workspace, SamplerWorkspace):
        raise TypeError(f"workspace must be a SamplerWorkspace, got {type(workspace).__name__}")
    if workspace.buffer.device != device:
        raise ValueError(f"workspace is on {workspace.buffer.device}, logits on {device}")
    if workspace.vocab_size != vocab_size:
        raise ValueError(f"workspace was allocated for vocab_size {workspace.vocab_size}, "
                         f"got {vocab_size}")
    if workspace.max_num_logits_per_req != layout.max_num_logits_per_req:
        raise ValueError(f"workspace was allocated for {workspace.max_num_logits_per_req} logits "
                         f"rows per request, the layout has {layout.max_num_logits_per_req}")
    if workspace.max_num_reqs < max_num_reqs:
        raise ValueError(f"workspace holds {workspace.max_num_reqs} requests, "
                         f"max_num_reqs is {max_num_reqs}")


def check_bitmask(bitmask, bitmask_rows, bitmask_enabled, words: int, num_rows: int,
                  device: torch.device) -> None:
    """The grammar bitmask [rows, >= `words`] int32, its row per logits row and its on/off flag."""
    if (bitmask is None) != (bitmask_rows is None):
        raise ValueError("bitmask and bitmask_rows go together: pass both or neither")
    if bitmask is not None:
        if not isinstance(bitmask, torch.Tensor) or bitmask.dtype != torch.int32:
            raise TypeError(f"bitmask must be an int32 tensor, got "
                            f"{getattr(bitmask, 'dtype', type(bitmask).__name__)}")
        if bitmask.device != device:
            raise ValueError(f"bitmask is on {bitmask.device}, logits on {device}")
        if bitmask.dim() != 2 or bitmask.shape[1] < words or bitmask.stride(1) != 1:
            raise ValueError(f"bitmask must be [rows, >= {words}] with a contiguous last dim, "
                             f"got shape {tuple(bitmask.shape)} strides {bitmask.stride()}")
        check_int32_vector("bitmask_rows", bitmask_rows, num_rows, device, where="logits")
    if bitmask_enabled is not None:
        if bitmask is None:
            raise ValueError("bitmask_enabled needs a bitmask")
        check_int32_vector("bitmask_enabled", bitmask_enabled, 1, device, where="logits")


def check_records(records, layout: RecordLayout, max_num_reqs: int, device) -> None:
    if not isinstance(records, torch.Tensor) or records.dtype != torch.int32:
        raise TypeError(f"records must be an int32 tensor, got "
                        f"{getattr(records, 'dtype', type(records).__name__)}")
    if records.device != device:
        raise ValueError(f"records is on {records.device}, logits on {device}")
    if records.dim() != 2 or records.shape[1] != layout.width or records.shape[0] < max_num_reqs \
            or records.stride(1) != 1:
        raise ValueError(f"records must be [>= {max_num_reqs}, {layout.width}] with a contiguous "
                         f"last dim, got shape {tuple(records.shape)} strides {records.stride()}")
