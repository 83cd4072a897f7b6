"""Plots of the sentiment task: the judge's reward of generations per temperature (the paper's Fig. 3), held-out
A_PL against β (Fig. 4) and held-out A_PL per method and domain."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.plotting import finish, line_plot, plt

SHOWN = ("sft", "ours", "bt+rwr", "ppo(tr)", "ppo(tr+te)", "dpo", "hpl", "oracle")


def _shared(method: str, beta: float) -> str:
    return method if method in ("sft", "hpl") else f"{method}@{beta:g}"


def plot_sentiment(folder: Path, cfg, cells: dict) -> None:
    """Three PNGs in `folder`: sentiment_judge.png, sentiment_beta.png, sentiment_apl.png."""
    flat = [c for row in cells.values() for c in row]
    temps = [f"{t:g}" for t in cfg.temperatures]
    fig, axes = plt.subplots(1, len(temps), figsize=(3.2 * len(temps), 3.6), sharey=True, squeeze=False)
    for ax, t in zip(axes[0], temps, strict=True):
        data = [np.concatenate([c["judge"][_shared(m, cfg.beta)][t]["scores"] for c in flat]) for m in SHOWN]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(SHOWN) + 1), SHOWN, rotation=60, fontsize=7)
        ax.set_title(f"temperature {t}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("judge P(positive)")
    fig.suptitle(f"Judge reward of generations on held-out domains (shared β = {cfg.beta:g})")
    fig.tight_layout()
    fig.savefig(folder / "sentiment_judge.png", dpi=110)
    plt.close(fig)
    grid = sorted(set(cfg.beta_grid))
    series = {m: (grid, [float(np.mean([c["apl"][f"{m}@{b:g}"] for c in flat])) for b in grid])
              for m in ("ours", "ours-matched", "bt+rwr", "dpo", "ppo(tr)", "ppo(tr+te)", "oracle")}
    line_plot(folder / "sentiment_beta.png", series, "β", "held-out A_PL (mean over seeds and domains)",
              "Held-out preference accuracy against β (Fig. 4)", log_x=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(cfg.held_out)
    for j, d in enumerate(cfg.held_out):
        means = [np.mean([row[j]["apl"][_shared(m, cfg.beta)] for row in cells.values()]) for m in SHOWN]
        ax.bar(np.arange(len(SHOWN)) + j * width, means, width, label=d)
    ax.axhline(0.5, color="k", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(SHOWN)) + 0.4 - width / 2, SHOWN, rotation=30, fontsize=8)
    finish(fig, ax, "held-out A_PL", f"Held-out A_PL per method and domain (shared β = {cfg.beta:g})",
           folder / "sentiment_apl.png", "method")
