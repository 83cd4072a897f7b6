"""The P-ShareLoRA reproduction's plots: sweep curves, bandit value gaps, federated accuracy by round and the
per-labeler text accuracies (Fig. 2-like)."""

from __future__ import annotations

from typing import Any

import numpy as np

from collabalign.methods.pshare_lora import LABELS
from collabalign.plotting import line_plot, plt
from collabalign.runs import RunDir


def mean_curve(c: dict[float, dict[str, list[float]]], metric: str) -> tuple[list[float], list[float]]:
    """Knob values in increasing order and the mean over seeds of `metric` at each."""
    xs = sorted(c)
    return xs, [float(np.mean(c[x][metric])) for x in xs]


def sweep_plot(run_dir: RunDir, name: str, c: dict[str, Any], xlabel: str) -> None:
    """Accuracy and subspace distance against the sweep's knob (log x), mean over seeds."""
    for metric in ("accuracy", "subspace_dist"):
        series = {LABELS[m]: mean_curve(cm, metric) for m, cm in c.items()}
        line_plot(run_dir.path / "plots" / f"sweep_{name.replace('=', '_')}_{metric}.png", series, xlabel, metric,
                  f"{metric} vs {xlabel}", log_x=True)


def bandit_plots(run_dir: RunDir, curves: dict[str, dict[str, dict[int, list[float]]]]) -> dict[str, str]:
    """Gap vs N_p per estimator at zeta = 0 and at each estimator's best zeta (lowest mean gap); returns the latter."""
    best = {m: min(c, key=lambda z: np.mean([np.mean(v) for v in c[z].values()])) for m, c in curves.items()}
    for name, pick in (("zeta0", {m: "0" for m in curves}), ("best_zeta", best)):
        series = {f"{LABELS[m]}" + (f", zeta {pick[m]}" if name == "best_zeta" else ""):
                  (sorted(c[pick[m]]), [float(np.mean(c[pick[m]][n])) for n in sorted(c[pick[m]])])
                  for m, c in curves.items()}
        line_plot(run_dir.path / "plots" / f"bandit_gap_{name}.png", series, "pairs per user N_p", "value gap",
                  f"pessimistic policy value gap ({name.replace('_', ' ')})", log_x=True)
    return {LABELS[m]: z for m, z in best.items()}


def federated_plot(run_dir: RunDir, acc: dict[str, dict[str, list]], labels: dict[str, str], rounds: int) -> None:
    """Held-out accuracy by round (mean over seeds); centralised methods as flat lines at their final accuracy."""
    series = {}
    for m, v in acc.items():
        if "accuracy_by_round" in v:
            xs = sorted(v["accuracy_by_round"][0])
            series[labels[m]] = (xs, [float(np.mean([run[r] for run in v["accuracy_by_round"]])) for r in xs])
        else:
            series[labels[m]] = ([0, rounds], [float(np.mean(v["accuracy"]))] * 2)
    line_plot(run_dir.path / "plots" / "federated_accuracy.png", series, "round", "held-out accuracy",
              "federated P-ShareLoRA vs baselines")


def labeler_bars(run_dir: RunDir, source: str, title: str, acc: dict, methods: list[str], oracle: np.ndarray) -> None:
    """Per-labeler accuracy bars, one colour per method (mean over seeds, std as error bars), like the paper's
    Fig. 2; the oracle as a black tick per labeler."""
    n = len(acc[methods[0]]["per_user"][0])
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * n), 4))
    for k, m in enumerate(methods):
        per_user = np.asarray(acc[m]["per_user"])
        ax.bar(np.arange(n) + (k - (len(methods) - 1) / 2) * width, per_user.mean(0), width,
               yerr=per_user.std(0), label=LABELS[m], capsize=2)
    if oracle.size:
        ax.scatter(np.arange(n), oracle.mean(0), marker="_", s=400, color="black", label="oracle", zorder=3)
    ax.set_xticks(np.arange(n), [f"labeler {i}" for i in range(n)])
    lowest = min(float(np.mean(acc[m]["per_user"], 0).min()) for m in methods)
    ax.set_ylim(min(0.4, lowest - 0.05), 1.0)
    ax.set_ylabel("held-out preference accuracy")
    ax.set_title(f"{title}: accuracy per labeler")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(run_dir.path / "plots" / f"text_{source}_per_labeler.png", dpi=110)
    plt.close(fig)
