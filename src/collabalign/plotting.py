"""Line plots saved as PNG (matplotlib, Agg backend): used by the report and by every experiment's plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["finish", "line_plot", "plt"]


def line_plot(path: Path, series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str,
              title: str, log_x: bool = False) -> None:
    """One line per label (x values, y values), saved as PNG at `path`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=".", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    finish(fig, ax, ylabel, title, path, xlabel)


def finish(fig: plt.Figure, ax: plt.Axes, ylabel: str, title: str, path: Path, xlabel: str = "round") -> None:
    """Labels a line plot, adds the legend and saves it as PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
