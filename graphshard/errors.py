"""Every exception graphshard raises on purpose, in one place (README "Errors" has the table).

Input mistakes form one family under `InvalidBatchError` (a `ValueError`): they are raised before
any device work or collective and change nothing, so the caller may fix the call and go on. Wrong
Python types and dtypes raise `InvalidTypeError`, which is also a `TypeError`, so code written
against either base keeps working. Faults (`StepFault`) are different: the TP group is broken and
the engine refuses every later step.

This module imports nothing, so `from graphshard import InvalidBatchError` stays cheap.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration field holds a value the engine cannot run with."""


class InvalidBatchError(ValueError):
    """A call's inputs break the engine's contract (README "The step"). Raised before any device
    work or collective; nothing changed. The base of every input mistake below."""


class InvalidTypeError(InvalidBatchError, TypeError):
    """An argument of the wrong Python type or dtype (float arrays, int64 drafts, a NumPy array
    where a tensor goes, ...)."""


class InvalidSlotError(InvalidBatchError):
    """`add_request` / `remove_request` named a slot out of range, one that already holds a
    request (without `replace=True`), or one that holds none."""


class InvalidParamsError(InvalidBatchError):
    """A `SamplingParams` field out of range or not finite, or asking for more logprobs than the
    config's `num_logprobs`."""


class BatchTooLargeError(InvalidBatchError):
    """The batch exceeds the largest captured bucket and the eager fallback is off."""


class RankDivergenceError(InvalidBatchError):
    """Ranks made different calls: different replicated step inputs or slot tables (found by
    `check_agreement`), or `capture()` called on some ranks only."""


class EngineStateError(RuntimeError):
    """A call the engine's state does not allow: anything after `close()`, `capture()` twice,
    or a CPU engine whose Triton kernels were not loaded for the interpreter."""


class StepFault(RuntimeError):
    """A step could not complete because of a peer (or this rank) failing; the group is broken.
    The first line of the message is the cause (what the peers reported, when they did)."""


def shown(value, limit: int = 40) -> str:
    """`repr(value)` for an error message, cut where long (a Fraction or int of hundreds of
    digits)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["BatchTooLargeError", "ConfigError", "EngineStateError", "InvalidBatchError",
           "InvalidParamsError", "InvalidSlotError", "InvalidTypeError", "RankDivergenceError",
           "StepFault"]
