"""Programmatic dependent launch: refused where the device cannot do it, ignored by an engine
whose device cannot, and compiled for sm_90 with the wait before every memory access of the
kernels launched so (the scan, the finish, the tp = 1 publish), and their dependents' trigger
after it; the tp = 1 fetch triggers before its first access where the scan depends on it. The
launches themselves run on a GPU only (`tests/gpu/test_pdl_gpu.py`)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from graphshard.config import Config
from graphshard.engine import Engine
from graphshard.engine.readout import HostRecords
from graphshard.errors import ConfigError
from graphshard.plan.staging import Staging
from graphshard.runtime.launch import deferred_launches
from graphshard.runtime.pdl import check_pdl, supports_pdl
from graphshard.sample.kernels import sample
from graphshard.sample.params import SamplingParams, SlotTables
from graphshard.sample.records import RecordLayout

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def test_a_cpu_refuses_pdl_with_a_clear_error():
    assert not supports_pdl(CPU)
    with pytest.raises(ValueError, match="pdl needs a CUDA device of compute capability 9.0"):
        check_pdl(True, CPU, "sample")
    with pytest.raises(TypeError, match="pdl must be a bool"):
        check_pdl(1, CPU, "sample")
    check_pdl(False, CPU, "sample")
    i32 = dict(dtype=torch.int32)
    layout = RecordLayout(1, 0)
    with pytest.raises(ValueError, match="sample: pdl needs"):
        sample(torch.zeros(1, 64), vocab_size=64, num_reqs=torch.ones(1, **i32),
               req_slots=torch.zeros(1, **i32), cu_num_logits=torch.arange(2, **i32),
               seq_lens=torch.zeros(1, **i32), tables=SlotTables(1, CPU), layout=layout,
               records=torch.zeros(1, layout.width, **i32), max_num_reqs=1, pdl=True)
    staging = Staging(2, CPU)
    with pytest.raises(ValueError, match="HostRecords: pdl needs"):
        HostRecords(torch.zeros(2, 4, **i32), staging, staging.views()[0], pdl=True)


def test_an_engine_on_a_device_without_pdl_steps_without_it():
    with pytest.raises(ConfigError, match="programmatic_launch' = 'yes': must be true or false"):
        Config(vocab_size=100, max_num_reqs=2, programmatic_launch="yes")
    cfg = Config(vocab_size=100, vocab_pad_multiple=4, max_num_reqs=2, buckets=(2,),
                 graph_backend="emulated", programmatic_launch=True)
    engine = Engine(cfg)
    engine.capture()
    assert engine.programmatic_launch is False and engine.stats()["programmatic_launch"] is False
    engine.add_request(0, SamplingParams(temperature=0.0))
    logits = torch.zeros(1, engine.vocab_shard)
    logits[0, 37] = 5.0
    engine.step(np.zeros(1, np.int32), np.arange(2, dtype=np.int32), np.zeros(1, np.int32), logits)
    assert list(engine.read().tokens(0)) == [37]


def test_an_engine_whose_device_can_launches_its_sampler_as_dependents(monkeypatch):
    """Where the device can, the step's sampler calls carry PDL (recorded, not run: the
    interpreter cannot execute the wait); the plain engine's do not."""
    import graphshard.engine.engine as engine_module
    import graphshard.runtime.pdl as pdl

    monkeypatch.setattr(engine_module, "supports_pdl", lambda device: True)
    monkeypatch.setattr(pdl, "supports_pdl", lambda device: True)
    cfg = Config(vocab_size=100, vocab_pad_multiple=4, max_num_reqs=4, buckets=(2, 4),
                 graph_backend="emulated")
    for asked in (False, True):
        engine = Engine(cfg.replace(programmatic_launch=asked))
        assert engine.programmatic_launch is asked
        launches = engine.parts.sampler_launches([(2, "replicate", 0), (4, "replicate", 0)])
        assert {item.kernel.fn.__name__ for item in launches} == {"_scan_kernel", "_finish_kernel"}
        for item in launches:
            assert item.kwargs.get("PDL", False) is asked, item.kernel.fn.__name__
            assert item.kwargs.get("launch_pdl", False) is asked
        assert engine.host_records._dependent == (dict(PDL=True, launch_pdl=True) if asked else {})
        # The step's fetch lets the scan after it launch early only where the scan is a
        # programmatic dependent.
        with deferred_launches() as launches:
            engine.parts.step_fn((2, "replicate", 0))()
        names = [item.kernel.fn.__name__ for item in launches]
        assert names[:2] == ["_fetch_kernel", "_scan_kernel"], names
        assert launches[0].kwargs.get("LAUNCH_DEPENDENTS", False) is asked
        assert "launch_pdl" not in launches[0].kwargs  # it follows the copy node: no wait


# Compiled in a child process (the interpreter replaces `@triton.jit` at import): the sampler's
# launches recorded as an engine's sampler makes them (with pdl), each variant compiled for
# sm_90, and where `griddepcontrol.wait` lies in its PTX.
_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import graphshard.sample.kernels as kernels
    from benchmarks.prebuild import compile_only
    from graphshard.engine.readout import _publish_kernel
    from graphshard.plan.staging import Staging
    from graphshard.runtime.launch import deferred_launches
    from graphshard.runtime.pdl import pdl_options
    from graphshard.sample.params import SlotTables
    from graphshard.sample.records import RecordLayout

    compile_only(90)  # nothing launches here: the sampler's check of pdl steps aside
    i32 = dict(dtype=torch.int32)
    layout = RecordLayout(1, 2)
    out = {}
    for pdl in (False, True):
        with deferred_launches() as launches:
            kernels.sample(torch.zeros(2, 1024), vocab_size=1000, num_reqs=torch.ones(1, **i32),
                           req_slots=torch.zeros(2, **i32), cu_num_logits=torch.arange(3, **i32),
                           seq_lens=torch.zeros(2, **i32), tables=SlotTables(2, "cpu"),
                           layout=layout, records=torch.zeros(2, layout.width, **i32),
                           max_num_reqs=2, pdl=pdl)
        for item in launches:
            name = item.kernel.fn.__name__
            compiled = item.kernel.warmup(*item.args, grid=item.grid, **item.kwargs)
            out[f"{name}:{pdl}"] = (compiled.metadata.launch_pdl, compiled.asm["ptx"])
        args = [torch.zeros(4, dtype=torch.int64) for _ in range(7)] + [torch.zeros(1, **i32)]
        args[:3] = torch.zeros(8, **i32), torch.zeros(2, **i32), torch.ones(1, **i32)
        compiled = _publish_kernel.warmup(*args, WIDTH=4, TOKENS=1, SLOT=8, BLOCK=1024,
                                          SHARED=False, grid=(1,), **pdl_options(pdl))
        out[f"_publish_kernel:{pdl}"] = (compiled.metadata.launch_pdl, compiled.asm["ptx"])
        staging = Staging(2, torch.device("cpu"))
        with deferred_launches() as launches:
            staging.fetch(pdl_next=pdl)
        (item,) = launches
        compiled = item.kernel.warmup(*item.args, grid=item.grid, **item.kwargs)
        out[f"_fetch_kernel:{pdl}"] = (compiled.metadata.launch_pdl, compiled.asm["ptx"])
    print(json.dumps(out))
""")


def _body_lines(ptx: str) -> list[str]:
    """The instructions of the PTX's entry function, in order."""
    body = ptx.split(".entry", 1)[1]
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("//")]


def test_kernels_launched_as_dependents_wait_before_touching_memory(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-4000:]
    compiled = json.loads(done.stdout.splitlines()[-1])
    kernels = ("_scan_kernel", "_finish_kernel", "_publish_kernel", "_fetch_kernel")
    assert set(compiled) == {f"{k}:{p}" for k in kernels for p in (False, True)}
    for key, (launch_pdl, ptx) in compiled.items():
        pdl = key.endswith(":True")
        # The fetch follows the step's copy node: it is never a dependent itself, but lets
        # the scan after it launch.
        fetch = key.startswith("_fetch_kernel")
        assert launch_pdl is (pdl and not fetch), key
        lines = _body_lines(ptx)
        waits = [i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait")]
        triggers = [i for i, line in enumerate(lines)
                    if line.startswith("griddepcontrol.launch_dependents")]
        memory = [i for i, line in enumerate(lines)
                  if line.startswith(("ld.global", "st.global", "atom.", "red.", "ld.volatile"))]
        if not pdl:
            assert not waits and not triggers, key
        elif fetch:
            assert not waits and len(triggers) == 1 and memory and triggers[0] < memory[0], key
        else:
            assert len(waits) == 1 and len(triggers) == 1 and waits[0] < triggers[0], key
            assert memory and waits[0] < memory[0], (key, lines[:waits[0] + 1])
