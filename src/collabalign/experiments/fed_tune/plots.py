"""The comparison's plot, one PNG per objective: each server optimiser's score (mean and sd over seeds) on the iid and
the Dirichlet split, FedAvg's quantised uploads beside it, the base model and centralised training as lines (for DPO
also the base model's own log-prob ranking, the gate's other floor)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.plotting import finish, plt


def plot_scores(path: Path, per: dict[str, np.ndarray], optimizers: list[str], bits: list[int], ylabel: str,
                title: str, base_ranking: float | None = None) -> None:
    """`per`: arm -> per-seed scores (arms as `comparison.arms` names them); `base_ranking`: a further line."""
    fig, ax = plt.subplots(figsize=(7, 4))
    names = optimizers + [f"fedavg-{b}bit" for b in bits]
    for offset, split in ((-0.1, "iid"), (0.1, "dirichlet")):
        rows = [(i, per[f"{split}/{n}"]) for i, n in enumerate(names) if f"{split}/{n}" in per]
        ax.errorbar([i + offset for i, _ in rows], [v.mean() for _, v in rows], [v.std() for _, v in rows],
                    fmt="o", capsize=3, label=split)
    for arm, style in (("base", ":"), ("centralised", "--")):
        ax.axhline(per[arm].mean(), color="grey", linestyle=style, label=arm)
    if base_ranking is not None:
        ax.axhline(base_ranking, color="grey", linestyle="-.", label="base model's own ranking")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    finish(fig, ax, ylabel, title, path, xlabel="server optimiser")
