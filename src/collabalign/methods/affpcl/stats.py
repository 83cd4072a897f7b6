"""Summaries of (T, R, n) error arrays: last-window MSE, mean and median curves with 90% bands, paired bootstrap
ratios and log-log slope fits. Medians are reported beside means because rare divergent runs dominate the mean at
high heterogeneity (spec §9 item 17)."""

from __future__ import annotations

import numpy as np
from scipy.special import stdtr

Z90 = 1.6449  # two-sided 90% normal quantile: the paper's band is mean +- 1.64 std / sqrt(runs)


def last_mse(err: np.ndarray, window: int = 10, agents: slice | int = slice(None)) -> np.ndarray:
    """Per run: the mean over the last `window` steps of the agent-averaged MSE (MSE^0) or one agent's MSE, (R,)."""
    chosen = err[-window:, :, agents]
    return chosen.mean(0) if chosen.ndim == 2 else chosen.mean((0, 2))


def bands(curves: np.ndarray, rng: np.random.Generator, boot: int = 500) -> dict[str, np.ndarray]:
    """Mean with the paper's 90% band and median with a 90% bootstrap band over runs, for curves (T, R)."""
    runs = curves.shape[1]
    mean = curves.mean(1)
    half = Z90 * curves.std(1, ddof=1) / np.sqrt(runs) if runs > 1 else np.zeros_like(mean)
    idx = rng.integers(runs, size=(boot, runs))
    medians = np.median(curves[:, idx], axis=2)  # (T, boot)
    lo, hi = np.quantile(medians, [0.05, 0.95], axis=1)
    return {"mean": mean, "mean_lo": mean - half, "mean_hi": mean + half, "median": np.median(curves, 1),
            "median_lo": lo, "median_hi": hi}


def ratio_ci(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, stat: str = "mean",
             boot: int = 2000) -> tuple[float, float, float]:
    """stat(a) / stat(b) over runs with a paired bootstrap 90% interval (runs share their instance across methods)."""
    f = np.mean if stat == "mean" else np.median
    idx = rng.integers(a.size, size=(boot, a.size))
    ratios = f(a[idx], axis=1) / f(b[idx], axis=1)
    lo, hi = np.quantile(ratios, [0.05, 0.95])
    return float(f(a) / f(b)), float(lo), float(hi)


def ci_dict(ci: tuple[float, float, float]) -> dict[str, float | list[float]]:
    """A ratio and its interval, rounded for summary.json."""
    return {"ratio": round(ci[0], 4), "ci90": [round(ci[1], 4), round(ci[2], 4)]}


def band_verdict(ci: tuple[float, float, float], low: float, high: float) -> str:
    """'reproduced' if the interval lies inside [low, high], 'not reproduced' if it lies outside, else inconclusive."""
    _, lo, hi = ci
    if low <= lo and hi <= high:
        return "reproduced"
    if hi < low or lo > high:
        return "not reproduced"
    return "inconclusive"


def ranks(v: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties given their average rank."""
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return (first + (counts - 1) / 2)[inverse]


def spearman(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Spearman rank correlation and its two-sided p-value (t approximation, as scipy.stats.spearmanr)."""
    rho = float(np.corrcoef(ranks(a), ranks(b))[0, 1])
    dof = a.size - 2
    t = rho * np.sqrt(dof / max(1.0 - rho**2, 1e-300))
    return rho, float(2 * stdtr(dof, -abs(t)))


def rivals_below(last: dict, levels: list[float], methods: tuple[str, ...], rng: np.random.Generator,
                 stat: str = "mean") -> tuple[dict, dict, dict]:
    """AffPCL against every rival at every level: (rivals whose error ratio interval lies above 1, i.e. significantly
    lower error than AffPCL; ties, whose interval contains 1; the point ratio AffPCL / rival), keyed "level/rival"."""
    beaten, ties, ratios = {}, {}, {}
    for lv in levels:
        for m in methods:
            if m == "affpcl":
                continue
            ci = ratio_ci(last[lv]["affpcl"], last[lv][m], rng, stat=stat)
            ratios[f"{lv:g}/{m}"] = round(ci[0], 4)
            if ci[1] > 1:
                beaten[f"{lv:g}/{m}"] = ci_dict(ci)
            elif ci[2] >= 1:
                ties[f"{lv:g}/{m}"] = ci_dict(ci)
    return beaten, ties, ratios
