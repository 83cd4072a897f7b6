"""Figures of the AffPCL reproduction: Fig. 1 panels (means and medians with 90% bands, log y; also Figs. 2 and 3),
Fig. 6 agent panels, the two theory checks (rate in t, speed-up against max{1/n, delta}), Fig. 4 heat maps and Fig. 5
contours."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.plotting import plt, save


def _band(ax: plt.Axes, t: np.ndarray, b: dict, which: str, label: str, style: str = "-") -> None:
    line, = ax.plot(t, b[which], style, label=label, lw=1.3)
    ax.fill_between(t, b[f"{which}_lo"], b[f"{which}_hi"], color=line.get_color(), alpha=0.15, lw=0)


def _axes_done(ax: plt.Axes, xlabel: str, ylabel: str, legend_size: int = 8) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def fig1(path: Path, levels: list[float], curves: dict[float, dict[str, dict]], labels: dict[str, str],
         title: str, every: int = 1, ylabel: str = "MSE^0", level_name: str = "delta_env = delta_obj") -> None:
    """Rows: mean and median MSE^0 over runs with 90% bands; columns: heterogeneity levels; AffPCL's agent 1 dashed.
    Curves hold one point per `every` steps (Fig. 2 evaluates test MSE every few steps)."""
    fig, axes = plt.subplots(2, len(levels), figsize=(3.6 * len(levels), 6.4), squeeze=False)
    for col, level in enumerate(levels):
        for row, which in enumerate(("mean", "median")):
            ax = axes[row, col]
            for method, b in curves[level].items():
                t = every * np.arange(1, len(b["mean"]) + 1)
                _band(ax, t, b, which, labels[method], "--" if method == "affpcl_agent1" else "-")
            ax.set_yscale("log")
            ax.set_title(f"{which}, {level_name} = {level:g}", fontsize=9)
            ax.set_xlabel("# samples (t)")
            ax.grid(alpha=0.3)
    for row in axes[:, 0]:
        row.set_ylabel(ylabel)
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.9, bottom=0.08, wspace=0.25, hspace=0.35)  # tight_layout is slow
    save(fig, path, tight=False)


def fig6(path: Path, panels: dict[str, dict[str, dict]]) -> None:
    """One panel per agent (generic, centre): IL and AffPCL MSE with 90% bands around the mean."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items(), strict=True):
        for method, b in curves.items():
            _band(ax, np.arange(1, len(b["mean"]) + 1), b, "mean", method)
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        _axes_done(ax, "# samples (t)", "MSE")
    save(fig, path)


def rate(path: Path, result: dict) -> None:
    """MSE^0 against t on log-log axes with a slope -1 guide, one line per level and method."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    t = np.array(result["t"])
    for level, curves in result["curves"].items():
        for method, cur in curves.items():
            ax.plot(t, cur, label=f"{method}, delta={level:g} (slope {result['slopes'][level][method]:.2f})")
    ref = np.array(next(iter(next(iter(result["curves"].values())).values())))
    ax.plot(t, ref[-1] * t[-1] / t, "k:", label="slope -1")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _axes_done(ax, "t", "MSE^0", legend_size=7)
    save(fig, path)


def speedup(path: Path, result: dict) -> None:
    """MSE ratio AffPCL / IL against max{1/n, delta}, with the fitted power law and the line y = x."""
    fig, ax = plt.subplots(figsize=(5, 4))
    pts = result["points"]
    for on_n, label in ((True, "n sweep, delta = 0"), (False, "delta sweep")):
        sel = [p for p in pts if (p["delta"] == 0) == on_n]
        ax.plot([p["x"] for p in sel], [p["ratio"] for p in sel], "o", label=label)
    x = np.geomspace(min(p["x"] for p in pts), 1, 50)
    ax.plot(x, result["constant"] * x ** result["slope"], "-", label=f"fit: slope {result['slope']:.2f}")
    ax.plot(x, x, "k:", label="y = x")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _axes_done(ax, "max{1/n, delta}", "MSE AffPCL / MSE independent")
    save(fig, path)


def heatmaps(path: Path, grid: list[float], f4: dict[str, np.ndarray]) -> None:
    """Fig. 4: improvement (%) of AffPCL over IL and over FedAvg, delta_env on y and delta_obj on x (NaN blank)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (key, title) in zip(axes, (("vs_il", "(a) vs independent"), ("vs_fedavg", "(b) vs FedAvg")), strict=True):
        im = ax.imshow(f4[key], cmap="YlGnBu", vmin=0, vmax=100, origin="lower")
        ticks = range(len(grid))
        ax.set_xticks(ticks, [f"{g:g}" for g in grid], fontsize=7)
        ax.set_yticks(ticks, [f"{g:g}" for g in grid], fontsize=7)
        for (r, c), v in np.ndenumerate(f4[key]):
            ax.text(c, r, "" if np.isnan(v) else f"{v:.0f}", ha="center", va="center", fontsize=6)
        ax.set_xlabel("delta_obj")
        ax.set_ylabel("delta_env")
        ax.set_title(f"improvement of AffPCL (%) {title}", fontsize=9)
        fig.colorbar(im, ax=ax, shrink=0.8)
    save(fig, path)


def contours(path: Path, n_list: list[int], deltas: list[float], mse: np.ndarray) -> None:
    """Fig. 5: iso-MSE contours of AffPCL (log10 MSE^0) in the (1/n, delta) plane, with the diagonal 1/n = delta."""
    fig, ax = plt.subplots(figsize=(5, 4.2))
    inv_n = 1 / np.array(n_list)
    cs = ax.contour(inv_n, deltas, np.log10(mse).T, levels=8, cmap="viridis")
    ax.clabel(cs, fontsize=7, fmt="%.1f")
    ax.plot([0, 0.5], [0, 0.5], "k:", lw=1, label="1/n = delta")
    ax.set_xlabel("1/n")
    ax.set_ylabel("delta_env = delta_obj")
    ax.set_title("AffPCL: contours of log10 MSE^0 (last 10 steps)", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)
