"""Plots of the language-model path: held-out reward trajectories (Figs. 1, 4-6), per-client λ trajectories with
the paper's EMA smoothing (half-life 20, Fig. 2), and the preference sweep's Pareto scatter (Fig. 3)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.plotting import ema, plt, save

HALF_LIFE = 20


def curve(runs: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """Rounds and the mean over seeds of `key` per evaluated round."""
    rounds = np.array([r["round"] for r in runs[0] if key in r])
    return rounds, np.mean([[r[key] for r in run if key in r] for run in runs], 0)


def lambda_steps(run: list[dict]) -> np.ndarray:
    """(clients, steps) λ_help of one run, the rounds' step logs concatenated."""
    return np.concatenate([np.asarray(r["lambda_steps"]) for r in run if "lambda_steps" in r], 1)


def _label(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def rewards(path: Path, results: dict[str, list[list[dict]]], arms: list[str], title: str) -> None:
    """Held-out helpful and harmless reward per round, mean over seeds, one line per arm."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key in zip(axes, ("eval_helpful", "eval_harmless"), strict=True):
        for arm in arms:
            ax.plot(*curve(results[arm], key), marker=".", label=arm)
        _label(ax, "round", key.replace("eval_", "held-out ") + " reward")
    save(fig, path, title)


def lambdas(path: Path, results: dict[str, list[list[dict]]], arms: list[str], title: str) -> None:
    """Per-client λ_help per local step (seed 0), EMA half-life 20, one panel per arm."""
    fig, axes = plt.subplots(1, len(arms), figsize=(4.2 * len(arms), 3.6), squeeze=False)
    for ax, arm in zip(axes[0], arms, strict=True):
        lam = lambda_steps(results[arm][0])
        for c, series in enumerate(ema(lam, HALF_LIFE)):
            ax.plot(series, lw=1, label=f"client {c}" if c < 4 else None)
        ax.set_title(arm, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        _label(ax, "local step", "λ_help (EMA)")
    save(fig, path, title)


def pareto(path: Path, results: dict[str, list[list[dict]]], arms: list[str]) -> None:
    """Final held-out (helpful, harmless) per arm: mean over seeds with one standard deviation."""
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    for arm in arms:
        pts = np.array([[np.mean([r[k] for r in run if k in r][-2:]) for k in ("eval_helpful", "eval_harmless")]
                        for run in results[arm]])
        sd = pts.std(0, ddof=1) if len(pts) > 1 else np.zeros(2)
        ax.errorbar(*pts.mean(0), xerr=sd[0], yerr=sd[1], marker="o", capsize=3, label=arm)
    _label(ax, "held-out helpfulness reward", "held-out harmlessness reward")
    save(fig, path, "Preference sweep (each marker: a global model)")


def plot_all(folder: Path, results: dict[str, list[list[dict]]]) -> None:
    """Every LM plot whose arms ran."""
    names = list(results)
    rq1 = [a for a in ("firm", "fedcmoo-a", "fedavg-ls") if a in results]
    if rq1:
        rewards(folder / "lm_rewards_rq1.png", results, rq1, "RQ1: FIRM vs FedCMOO-A (mean over seeds)")
        lambdas(folder / "lm_lambda_rq1.png", results, rq1[:2], "RQ1: λ per client")
    betas = [a for a in names if a.startswith("beta=")]
    if betas:
        lambdas(folder / "lm_lambda_beta.png", results, betas, "RQ2: λ per client across β (seed 0)")
        rewards(folder / "lm_rewards_beta.png", results, betas, "RQ2: rewards across β")
    prefs = [a for a in names if a.startswith("p1/p2=")]
    if prefs:
        pareto(folder / "lm_pareto.png", results, prefs + rq1)
    ablations = [a for a in names if a == "hetero-rm" or a.startswith(("dirichlet=", "C="))]
    if ablations and "firm" in results:
        rewards(folder / "lm_rewards_ablations.png", results, ["firm", *ablations], "Ablations vs the base run")
