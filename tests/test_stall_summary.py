"""`benchmarks.stall_summary` on a small synthetic Nsight Compute export: stretches, stall
reasons and the per-source-line view (the line table stubbed: a CPU machine has no profile)."""

import pytest

from benchmarks import stall_summary

HEADER = ["Address", "Source", "Instructions Executed", "Warp Stall Sampling (All Samples)",
          "stall_long_sb", "stall_wait"]
ROWS = [  # one executed stretch, a gap of six never-run instructions, another stretch
    ["0x0", "LDG.E R1", "10", "60", "50", "10"],
    ["0x10", "FADD R2", "10", "20", "0", "20"],
    *[[f"0x{16 * (i + 2):x}", "NOP", "0", "0", "0", "0"] for i in range(6)],
    ["0x80", "STG.E R2", "20", "20", "10", "10"],
]


@pytest.fixture
def export(tmp_path):
    path = tmp_path / "k.sass.csv"
    lines = ['"Kernel: _scan_kernel"', ",".join(f'"{h}"' for h in HEADER)]
    lines += [",".join(f'"{v}"' for v in row) for row in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_summary_splits_stretches_and_ranks_stall_reasons(export):
    text = stall_summary.summary(export)
    assert "[    0,     1] samples  80.0%  instructions  50.0%" in text
    assert "[    8,     8] samples  20.0%  instructions  50.0%" in text
    assert "stalls: long_sb 60.0%, wait 40.0%" in text


def test_by_line_adds_up_each_source_line(export, monkeypatch):
    where = ["rows.py:61"] * 2 + ["?"] * 6 + ["rows.py:61"]
    monkeypatch.setattr(stall_summary, "source_lines", lambda cubin: where)
    text = stall_summary.by_line(export, "k.cubin")
    assert text.splitlines()[0].split() == ["rows.py:61", "samples", "100.0%", "instructions",
                                            "100.0%"]


def test_by_line_refuses_a_cubin_of_another_kernel(export, monkeypatch):
    monkeypatch.setattr(stall_summary, "source_lines", lambda cubin: ["rows.py:1"] * 3)
    with pytest.raises(ValueError, match="not the profiled kernel"):
        stall_summary.by_line(export, "k.cubin")
