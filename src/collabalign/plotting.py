"""Line plots saved as PNG (matplotlib, Agg backend): used by the report and by every experiment's plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["ema", "finish", "line_plot", "plt", "save"]


def line_plot(path: Path, series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str,
              title: str, log_x: bool = False, log_y: bool = False) -> None:
    """One line per label (x values, y values), saved as PNG at `path`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=".", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    finish(fig, ax, ylabel, title, path, xlabel)


def finish(fig: plt.Figure, ax: plt.Axes, ylabel: str, title: str, path: Path, xlabel: str = "round") -> None:
    """Labels a line plot, adds the legend and saves it as PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def save(fig: plt.Figure, path: Path, title: str | None = None, tight: bool = True) -> None:
    """Saves a figure as PNG (110 dpi) and closes it; `title` as the figure's suptitle."""
    if title is not None:
        fig.suptitle(title)
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ema(values: np.ndarray, half_life: float, axis: int = -1) -> np.ndarray:
    """pandas' ewm(halflife=half_life, adjust=True).mean() along `axis`."""
    x = np.moveaxis(np.asarray(values, dtype=float), axis, 0)
    decay = 0.5 ** (1 / half_life)
    num, den, out = np.zeros(x.shape[1:]), 0.0, np.empty(x.shape)
    for t in range(len(x)):
        num, den = decay * num + x[t], decay * den + 1.0
        out[t] = num / den
    return np.moveaxis(out, 0, axis)
