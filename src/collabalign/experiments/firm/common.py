"""Helpers the synthetic FIRM parts share: a declared claim decided under the name of its setting, summaries of
replicates, and the preference vectors of the p sweeps."""

from __future__ import annotations

import numpy as np


def summary(values: np.ndarray) -> dict[str, float]:
    """Mean and standard deviation over replicates (measured context of a claim)."""
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "sd": float(v.std(ddof=1)) if v.size > 1 else 0.0}


def preference(ratio: float) -> tuple[float, float]:
    """p with p1 / p2 = ratio and p1 + p2 = 2 (spec §3.2, §9 item 6: s = 1)."""
    return (2 * ratio / (1 + ratio), 2 / (1 + ratio))


def last_mean(curves: np.ndarray, window: int) -> np.ndarray:
    """Per replicate: the mean over the last `window` rounds of curves (T, R, ...)."""
    return curves[-max(1, window):].mean(0)
