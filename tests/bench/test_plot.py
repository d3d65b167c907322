"""The benchmarks' per-turn plot (``scripts/bench/plot.py``): an SVG with one line per mode and a panel per figure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))


def test_per_turn_draws_one_line_per_mode_in_each_panel(tmp_path):
    pytest.importorskip("matplotlib", reason="the bench extra (the dev extra includes it)")
    from bench.plot import per_turn

    series = {"header": [(20, 5.0), (18, 4.0), (19, 4.5)], "replay": [(20, 5.0), (60, 9.0), (100, 14.0)]}
    path = per_turn(tmp_path / "plot.svg", series, [(0, "prompt tokens"), (1, "latency (ms)")], title="t", note="n")
    svg = path.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert svg.count("prompt tokens") == 1 and svg.count("latency (ms)") == 1
    assert "header" in svg and "replay" in svg  # the legend
    assert per_turn(tmp_path / "again.svg", series, [(0, "prompt tokens"), (1, "latency (ms)")], title="t", note="n").read_text() == svg
