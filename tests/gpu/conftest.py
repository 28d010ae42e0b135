"""Shared by the device-only tests."""

import json
import os

import pytest


@pytest.fixture
def gpu_report():
    """`gpu_report(name, data)` appends one JSON line to $OUT/gpu_report.jsonl (the device run's
    result folder), so a run's numbers come back with it; without $OUT it does nothing."""
    def write(name: str, data: dict) -> None:
        out = os.environ.get("OUT")
        if out:
            with open(os.path.join(out, "gpu_report.jsonl"), "a") as f:
                f.write(json.dumps({"test": name, **data}) + "\n")
    return write
