"""graphshard: batch-sharded, CUDA-graph-captured sampling for tensor-parallel LLM decode loops.

    from graphshard import Engine, Config, SamplingParams

The names below load on first use (PEP 562), so `import graphshard` imports torch but no Triton
kernel. Every error type is here too (`graphshard.errors`).

On a machine without CUDA, importing graphshard sets `TRITON_INTERPRET=1` when the variable is
unset: Triton reads it when a kernel module is imported, and only its interpreter runs kernels on
the CPU. This is the one change graphshard makes to the process's environment (other Triton
kernels the process imports afterwards are interpreted too). An explicit `TRITON_INTERPRET` is
left alone; a CPU engine whose kernels were not loaded for the interpreter refuses to build,
saying what to set.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from graphshard._lazy import lazy_exports
from graphshard.errors import (
    BatchTooLargeError,
    ConfigError,
    EngineStateError,
    InvalidBatchError,
    InvalidParamsError,
    InvalidSlotError,
    InvalidTypeError,
    RankDivergenceError,
    StepFault,
)

__version__ = "0.1.0"  # tests/test_api.py checks it against pyproject.toml


def _use_interpreter_without_cuda() -> None:
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch

    # A CPU-only build of torch answers without touching a driver.
    if (torch.version.cuda is None and torch.version.hip is None) or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_use_interpreter_without_cuda()

# module -> the public names it defines, each loaded on first use.
_LAZY = {
    "config": ("Config",),
    "engine.engine": ("Engine",),
    "sample.params": ("SamplingParams",),
    "sample.records": ("HostOutput", "RecordLayout", "SamplerOutput"),
}

if TYPE_CHECKING:  # what type checkers and IDEs see for the lazy names
    from graphshard.config import Config
    from graphshard.engine import Engine
    from graphshard.sample.params import SamplingParams
    from graphshard.sample.records import HostOutput, RecordLayout, SamplerOutput


__getattr__, __dir__, _ = lazy_exports(__name__, _LAZY)

__all__ = [
    "BatchTooLargeError", "Config", "ConfigError", "Engine", "EngineStateError", "HostOutput",
    "InvalidBatchError", "InvalidParamsError", "InvalidSlotError", "InvalidTypeError",
    "RankDivergenceError", "RecordLayout", "SamplerOutput", "SamplingParams", "StepFault",
    "__version__",
]
