"""Figures of the synthetic FIRM parts (matplotlib, Agg): R1 stationarity curves, Pareto scatters with the exact
front and λ dispersion against β; R2 stationarity, dispersion, critic error and floors; R3 per-client λ
trajectories (EMA half-life 20, as the paper plots them), reward trajectories, the preference-sweep scatter and the
ablations."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.plotting import ema, plt, save

HALF_LIFE = 20


def _done(ax: plt.Axes, xlabel: str, ylabel: str, title: str = "", legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def r1(folder: Path, cfg, by_sigma: dict, problems: dict, pref_runs: dict, pref_problem, settings: dict) -> None:
    """Stationarity per round, Pareto scatter with the exact front (and the preference sweep), D_λ against β."""
    fig, axes = plt.subplots(1, len(by_sigma), figsize=(5 * len(by_sigma), 3.8), squeeze=False)
    for ax, (sigma, runs) in zip(axes[0], by_sigma.items(), strict=True):
        for label, r in runs.items():
            ax.plot(np.arange(1, len(r["stationarity"]) + 1), r["stationarity"].mean(1), label=label, lw=1.2)
        ax.set_yscale("log")
        _done(ax, "round", "min_λ ‖∇J(θ̄)λ‖²", f"R1 Pareto stationarity, σ = {sigma:g}")
    save(fig, folder / "r1_stationarity.png")

    panels = len(by_sigma) + 1
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 4.2), squeeze=False)
    for ax, (sigma, runs) in zip(axes[0], by_sigma.items(), strict=False):
        front = problems[sigma].front()[0]
        ax.plot(front[:, 0], front[:, 1], "k-", lw=1, label="exact front")
        for label, r in runs.items():
            final = r["values"][-1]
            line, = ax.plot(*final.mean(0), "o", label=label)
            ax.plot(final[:, 0], final[:, 1], ".", color=line.get_color(), alpha=0.3)
        _done(ax, "f1", "f2", f"R1 final (f1, f2), σ = {sigma:g}")
    ax = axes[0, -1]
    front = pref_problem.front()[0]
    ax.plot(front[:, 0], front[:, 1], "k-", lw=1, label="exact front")
    for label, r in pref_runs.items():
        ax.plot(*r["values"][-1].mean(0), "s", label=label)
    _done(ax, "f1", "f2", f"R1 preference sweep, σ = {cfg.preference_sigma:g}")
    save(fig, folder / "r1_pareto.png")

    betas = [b for b in cfg.betas if b > 0]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    curves = {f"σ = {s:g}": runs for s, runs in by_sigma.items()}
    if settings.get("M=3") is not None:
        curves[f"M = 3, σ = {cfg.noisy_sigma:g}"] = settings["M=3"]
    for ax, key, ylabel in ((axes[0], "dispersion", "D_λ"), (axes[1], "disagreement", "T^disagr")):
        for name, runs in curves.items():
            ax.plot(betas, [runs[f"firm beta={b:g}"][key].mean() for b in betas], "o-", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _done(ax, "β", f"{ylabel} (mean over steps and seeds)", f"R1 {ylabel} against β")
    save(fig, folder / "r1_dispersion.png")


def r2(folder: Path, labels: list[str], out: dict, critic: dict, floors: dict) -> None:
    """T-FIRM: stationarity (running average and per round), D_λ per round, Lemma 3 critic error, floors."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    t = np.arange(1, out["stationarity"].shape[0] + 1)
    for i, label in enumerate(labels):
        axes[0].plot(t, out["running_average"][:, :, i].mean(1), label=label, lw=1.2)
        axes[1].plot(t, out["stationarity"][:, :, i].mean(1), label=label, lw=1.2)
        axes[2].plot(t, out["dispersion"][:, :, i].mean(1), label=label, lw=1.2)
    for ax, ylabel in zip(axes, ("running mean of ‖∇J(θ̄)λ̄‖²", "min_λ ‖∇J(θ̄)λ‖²", "D_λ"), strict=True):
        ax.set_yscale("log")
        _done(ax, "round", ylabel, "R2 T-FIRM")
    save(fig, folder / "r2_tfirm.png")

    fig, axes = plt.subplots(1, 1 + len(floors), figsize=(4.6 * (1 + len(floors)), 3.8), squeeze=False)
    for batch, errs in critic.items():
        axes[0, 0].plot(np.arange(len(errs)), errs.mean(1), label=f"D = {batch}")
    axes[0, 0].set_yscale("log")
    _done(axes[0, 0], "critic mini-batches N", "‖w_N − V^π‖²", "Lemma 3 on a fixed policy")
    for ax, (name, (xs, ys)) in zip(axes[0, 1:], floors.items(), strict=True):  # ys (seeds, points)
        ax.plot(xs, ys.mean(0), "o-", label="mean over seeds")
        for y in ys:
            ax.plot(xs, y, ".", color="grey", alpha=0.4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        _done(ax, name, "floor of ‖∇J(θ̄)λ̄‖²", f"R2 floor against {name}")
    save(fig, folder / "r2_critic_floors.png")


def r3_lambda_clients(path: Path, panels: dict[str, np.ndarray]) -> None:
    """Per-client λ_1 per optimiser step (replicate 0, EMA half-life 20), one panel per (world, β)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False)
    for ax, (title, lam) in zip(axes[0], panels.items(), strict=True):  # lam (steps, C)
        smooth = ema(lam, HALF_LIFE, axis=0)
        for c in range(lam.shape[1]):
            line, = ax.plot(smooth[:, c], label=f"client {c}")
            ax.plot(lam[:, c], color=line.get_color(), alpha=0.15, lw=0.6)
        ax.set_ylim(-0.02, 1.02)
        _done(ax, "optimiser step", "λ_help", title)
    save(fig, path)


def r3_trajectories(path: Path, arms: dict[str, dict]) -> None:
    """Client-mean training rewards per batch and client-mean λ_1 per step (EMA half-life 20), one line per arm."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, r in arms.items():
        for j, ax in enumerate(axes[:2]):
            ax.plot(ema(r["train_rewards"][..., j].mean(1), HALF_LIFE, axis=0), label=name)
        axes[2].plot(ema(r["lambda"][..., 0].mean((1, 2)), HALF_LIFE, axis=0), label=name)
    for ax, ylabel in zip(axes, ("helpfulness reward (train)", "harmlessness reward (train)", "λ_help (client mean)"),
                          strict=True):
        _done(ax, "batch" if "reward" in ylabel else "optimiser step", ylabel, "R3 (EMA half-life 20)")
    save(fig, path)


def r3_pareto(path: Path, points: dict[str, np.ndarray], sweep: list[str]) -> None:
    """Final held-out (help, harm) per arm (mean and per-seed dots); the preference sweep joined by a line."""
    fig, ax = plt.subplots(figsize=(5.5, 4.6))
    xs = [points[k].mean(0) for k in sweep]
    if xs:
        ax.plot([x[0] for x in xs], [x[1] for x in xs], "k:", lw=1)
    for name, final in points.items():
        line, = ax.plot(*final.mean(0), "s" if name in sweep else "o", label=name)
        ax.plot(final[:, 0], final[:, 1], ".", color=line.get_color(), alpha=0.3)
    _done(ax, "helpfulness (held-out, exact)", "harmlessness (held-out, exact)", "R3 final trade-off per arm")
    save(fig, path)


def r3_ablations(path: Path, arms: dict[str, dict]) -> None:
    """Held-out rewards per round and client-mean λ_1 (EMA) of the base run and its ablations."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, r in arms.items():
        for j, ax in enumerate(axes[:2]):
            ax.plot(r["held_out"][..., j].mean(1), marker=".", label=name)
        axes[2].plot(ema(r["lambda"][..., 0].mean((1, 2)), HALF_LIFE, axis=0), label=name)
    _done(axes[0], "round", "helpfulness (held-out)", "R3 ablations")
    _done(axes[1], "round", "harmlessness (held-out)", "R3 ablations")
    _done(axes[2], "optimiser step", "λ_help (client mean, EMA)", "R3 ablations")
    save(fig, path)
