"""Sweep boxplots (paper Figure 2 style): a real PNG from real rows, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from burstctl.simulator.bws.plots import boxplots

ROWS = [
    {"pressure_goal": w, "policy": p, "min_yield": y, "efficiency": y, "error": ""}
    for w in ("0.5", "1.1")
    for p, y in (("fair-share", "0.9"), ("fcfs", "0.5"), ("fcfs", "0.7"))
]


def test_writes_a_png(tmp_path: Path) -> None:
    out = boxplots(ROWS, tmp_path / "f.png", "min_yield", ["fcfs", "fair-share"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_failed_rows_are_left_out_and_nothing_to_plot_is_an_error(tmp_path: Path) -> None:
    failed = [{**r, "error": "boom"} for r in ROWS]
    with pytest.raises(ValueError, match="no successful runs"):
        boxplots(failed, tmp_path / "f.png")


def test_unknown_metric_column(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no 'utilization' column"):
        boxplots(ROWS, tmp_path / "f.png", "utilization")
