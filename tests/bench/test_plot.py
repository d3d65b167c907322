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


def test_lines_plots_against_the_given_sizes(tmp_path):
    """The cluster bench's plot: turns/s against 1, 2, 4 pairs (not turns 1, 2, 3)."""
    pytest.importorskip("matplotlib", reason="the bench extra (the dev extra includes it)")
    from bench.plot import lines

    series = {"measured": [(3.0, 1.0), (5.0, 1.7), (7.0, 2.3)], "linear": [(3.0, 1.0), (6.0, 2.0), (12.0, 4.0)]}
    svg = lines(tmp_path / "scale.svg", [1, 2, 4], series, [(0, "turns/s"), (1, "x of 1 pair")],
                x_label="pairs", title="t").read_text()
    assert "pairs" in svg and "turns/s" in svg and "measured" in svg and "linear" in svg
    evenly = lines(tmp_path / "even.svg", [1, 2, 3], series, [(0, "turns/s"), (1, "x of 1 pair")],
                   x_label="pairs", title="t").read_text()
    assert evenly != svg  # the points sit at the sizes given
