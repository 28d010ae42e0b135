"""Process launching and group setup: `spawn` for tests and demos, `init_from_env` for torchrun.

Every process started here (or initialized through `init_from_env`) sets the environment that
keeps NCCL and symmetric memory off NVLink multicast before any communicator exists.
"""

from __future__ import annotations

import os
import pickle
import queue
import shutil
import tempfile
import threading
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Multicast objects are not available on every machine these processes land on; unicast paths
# are what the transports are built for.
GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
BACKENDS = ("gloo", "nccl")
# Time the parent keeps collecting reports after the first failure, so the rank that failed
# first (not the peers that lost it) shows up in the error.
_FAILURE_GRACE_S = 2.0
# Fresh starts of every rank when the process group does not form: gloo's mesh over loopback
# can lose a connection on a loaded machine ("connectFullMesh failed ... Connection closed by
# peer") before any rank ran `fn`.
GROUP_RETRIES = 1
# A rank's report: (rank, status, payload), payload the pickled result or a traceback.
_DONE, _FAILED, _NO_GROUP = "done", "failed", "no group"


def set_gpu_env() -> None:
    os.environ.update(GPU_ENV)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> DistInfo:
    """Initialize the default process group from torchrun's RANK / WORLD_SIZE / LOCAL_RANK."""
    set_gpu_env()
    try:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    except KeyError as e:
        raise RuntimeError(f"init_from_env needs {e.args[0]} in the environment "
                           "(run under torchrun)") from None
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = _bind_device(backend, local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), **_device_id(device))
    return DistInfo(rank, world_size, local_rank, device, backend)


def _bind_device(backend: str, local_rank: int) -> torch.device:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "nccl":
        if not torch.cuda.is_available() or torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"backend 'nccl' needs CUDA device {local_rank}; "
                               f"{torch.cuda.device_count()} visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _device_id(device: torch.device) -> dict:
    """Bind NCCL groups to their device: communicators come up eagerly and collectives such as
    barrier() know their device."""
    return {"device_id": device} if device.type == "cuda" else {}


def _exit_with_parent() -> None:
    """A rank whose parent died (killed by a harness, say) would otherwise outlive it, possibly
    blocked in a collective forever."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch():
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="graphshard-parent-watch", daemon=True).start()


def _worker(fn, rank: int, world_size: int, args: tuple, backend: str, init_file: str,
            timeout_s: float, reports) -> None:
    _exit_with_parent()
    set_gpu_env()
    try:
        device = _bind_device(backend, rank)
    except BaseException:
        reports.put((rank, _FAILED, traceback.format_exc()))
        return
    try:
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s),
                                **_device_id(device))
    except BaseException:
        reports.put((rank, _NO_GROUP, traceback.format_exc()))
        return
    try:
        # Plain pickle copies tensors by value: the child may exit before the parent reads.
        report = (rank, _DONE, pickle.dumps(fn(rank, world_size, *args)))
    except BaseException:
        report = (rank, _FAILED, traceback.format_exc())
    # Report before tearing down: after a failure the teardown may wait on peers forever (the
    # parent kills what is left).
    reports.put(report)
    if dist.is_initialized():
        dist.destroy_process_group()


def spawn(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 300.0,
          failure_grace_s: float = _FAILURE_GRACE_S) -> list:
    """Run `fn(rank, world_size, *args)` in `world_size` fresh processes with torch.distributed
    initialized (file rendezvous in a fresh temp dir). Returns each rank's return value in rank
    order; raises RuntimeError with the failing ranks' tracebacks, TimeoutError past `timeout_s`.
    After the first failure the others get `failure_grace_s` to report before they are killed.
    Where a rank could not join the process group, every rank starts again, GROUP_RETRIES
    times at most (each start has its own `timeout_s`). `fn` and `args` must be picklable (a
    module-level function)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    for attempt in range(GROUP_RETRIES + 1):
        results, errors, no_group = _spawn_once(fn, world_size, args, backend, timeout_s,
                                                failure_grace_s)
        if not no_group or attempt == GROUP_RETRIES:
            break
        first = min(no_group)
        warnings.warn(f"spawn: rank {first} could not join the process group; starting all "
                      f"{world_size} ranks again:\n{errors[first]}", RuntimeWarning, stacklevel=2)
    if errors:
        text = "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise RuntimeError(f"{len(errors)} of {world_size} ranks failed:\n{text}")
    return [pickle.loads(results[r]) for r in range(world_size)]


def _spawn_once(fn, world_size: int, args: tuple, backend: str, timeout_s: float,
                failure_grace_s: float) -> tuple[dict, dict, set]:
    """One start of every rank -> (results, errors, ranks that could not join the group)."""
    ctx = mp.get_context("spawn")
    tmpdir = tempfile.mkdtemp(prefix="graphshard-rdzv-")
    reports = ctx.Queue()
    procs = [ctx.Process(target=_worker, daemon=True,
                         args=(fn, r, world_size, args, backend, os.path.join(tmpdir, "store"),
                               timeout_s, reports))
             for r in range(world_size)]
    results, errors, no_group = {}, {}, set()
    try:
        with _child_env(GPU_ENV):
            for p in procs:
                p.start()
        results, errors, no_group = _collect(procs, reports, timeout_s, failure_grace_s)
    finally:
        _stop(procs, grace_s=10.0 if len(results) == world_size else 0.0)
        reports.close()
        _remove_dir(tmpdir)
    return results, errors, no_group


@contextmanager
def _child_env(env: dict[str, str]):
    """Children inherit the environment at start: set `env` for them, then restore the parent's,
    so the variables hold from the child's first import on."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _remove_dir(path: str) -> None:
    """Remove the rendezvous dir; a rank that exits late may still be writing its store file."""
    for _ in range(3):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.5)


def _collect(procs, reports, timeout_s: float,
             failure_grace_s: float) -> tuple[dict, dict, set]:
    world_size = len(procs)
    deadline = time.monotonic() + timeout_s
    results: dict[int, bytes] = {}
    errors: dict[int, str] = {}
    no_group: set[int] = set()
    first_error_at = None
    while len(results) + len(errors) < world_size:
        now = time.monotonic()
        if first_error_at is not None and now - first_error_at > failure_grace_s:
            break
        if now > deadline:
            missing = sorted(set(range(world_size)) - set(results) - set(errors))
            if errors:
                break
            raise TimeoutError(f"spawn: ranks {missing} did not finish within {timeout_s:.0f} s "
                               f"(killed)")
        try:
            rank, status, payload = reports.get(timeout=0.1)
        except queue.Empty:
            _note_silent_deaths(procs, results, errors)
            if errors and first_error_at is None:
                first_error_at = time.monotonic()
            continue
        if status == _DONE:
            results[rank] = payload
        else:
            errors[rank] = payload
            if status == _NO_GROUP:
                no_group.add(rank)
            if first_error_at is None:
                first_error_at = time.monotonic()
    return results, errors, no_group


def _note_silent_deaths(procs, results, errors) -> None:
    """A rank that exits without reporting (a crash, a kill) counts as failed."""
    for r, p in enumerate(procs):
        if r in results or r in errors or p.is_alive():
            continue
        p.join(timeout=0)
        if p.exitcode not in (None, 0):
            errors[r] = f"process exited with code {p.exitcode} without a report\n"


def _stop(procs, grace_s: float) -> None:
    """Let reported ranks exit on their own for `grace_s`, then kill whatever still runs."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=30)
