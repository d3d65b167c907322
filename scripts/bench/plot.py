"""Plots of the benchmarks (matplotlib, the ``bench`` extra): one line per mode against the turn (or the cluster's
size), written as SVG beside the table a script prints, so the docs can show the latest run."""

from __future__ import annotations

from pathlib import Path


def per_turn(path: str | Path, series: dict[str, list[tuple[float, ...]]], panels: list[tuple[int, str]], *, title: str, note: str = "") -> Path:
    """Write ``path`` (SVG): for each ``(index, label)`` of ``panels`` a panel with one line per mode of ``series``
    (mode → one tuple of figures per turn, turn 1 first), its ``index``-th figure against the turn."""
    turns = range(1, max(len(rows) for rows in series.values()) + 1)
    return lines(path, list(turns), series, panels, x_label="turn", title=title, note=note)


def lines(path: str | Path, xs: list[float], series: dict[str, list[tuple[float, ...]]], panels: list[tuple[int, str]], *,
          x_label: str, title: str, note: str = "") -> Path:
    """Like :func:`per_turn`, against ``xs`` (one per tuple of each mode) labelled ``x_label``."""
    import matplotlib

    matplotlib.use("Agg")  # no display, no window
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "memt"  # the same run draws the same file
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.6), squeeze=False)
    for ax, (index, label) in zip(axes[0], panels):
        for mode, rows in series.items():
            ax.plot(xs[:len(rows)], [row[index] for row in rows], marker=".", label=mode)
        ax.set_xlabel(x_label)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    figure.suptitle(title, fontsize=10)
    if note:
        figure.text(0.01, 0.01, note, fontsize=7, alpha=0.7)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)
    return path
