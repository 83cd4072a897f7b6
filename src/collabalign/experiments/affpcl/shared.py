"""Helpers the AffPCL parts share: last-window errors per run, mean and median curves with 90% bands for the plots
(medians beside means because rare divergent runs dominate the mean at high heterogeneity, spec §9 item 17), and a
declared claim under the name of the cell it is decided in."""

from __future__ import annotations

import numpy as np

Z90 = 1.6449  # two-sided 90% normal quantile: the paper's band is mean +- 1.64 std / sqrt(runs)
# Errors are compared by per-run ratios (log scale, lower is better). "Matches", "never worse" and "best or tied" are
# one-sided with margin 0.5, i.e. at most a factor 1.5 worse (declared in issue 12: the upper end of the match band
# [2/3, 1.5] declared before it). On the scale of these errors that is small: where IL and FedAvg differ by design,
# FedAvg's linear speed-up at delta = 0 is a factor n (20 in Fig. 1), and log 1.5 is 14% of log 20.
LOWER = {"scale": "ratio", "lower_is_better": True}
MATCH = {"margin": 0.5, **LOWER}


def last_mse(err: np.ndarray, window: int = 10) -> np.ndarray:
    """Per run: the mean over the last `window` steps of the agent-averaged error (MSE^0), (R,)."""
    return err[-window:].mean((0, 2))


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


def summary(values: np.ndarray) -> dict[str, float]:
    """Mean and median over runs (measured context of a claim)."""
    return {"mean": float(np.mean(values)), "median": float(np.median(values))}
