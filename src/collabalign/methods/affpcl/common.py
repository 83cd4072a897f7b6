"""Shared pieces of the vectorised algorithms: noise draws, step schedules and the error record."""

from __future__ import annotations

import numpy as np

from collabalign.methods.affpcl.systems import GaussianSystems


def draw_noise(system: GaussianSystems, steps: int, rng: np.random.Generator) -> np.ndarray:
    """All standard-normal sample noise of a run up front, (T, R, n, d): one fresh sample per agent per step, and the
    per-agent reference implementation can replay exactly the same draws."""
    return rng.standard_normal((steps, system.runs, system.n, system.d))


def schedule(alpha: float | np.ndarray, steps: int, runs: int) -> np.ndarray:
    """Step sizes as a (T, R) array from a constant, a per-step (T,) array, a per-run (R,) array or a (T, R) array."""
    a = np.asarray(alpha, dtype=float)
    if a.ndim == 1 and a.size == runs and a.size != steps:
        a = a[None, :]
    elif a.ndim == 1:
        a = a[:, None]
    return np.broadcast_to(a, (steps, runs))


def theory_steps(system: GaussianSystems, steps: int, c: float = 2.0, alpha0: float = 0.01) -> np.ndarray:
    """Diminishing steps alpha_t = c / (lambda (t + t0)) per run, t0 chosen so that alpha_0 = alpha0 (§7.2 item 2)."""
    t0 = c / (alpha0 * system.lam)
    return c / (system.lam[None, :] * (np.arange(steps)[:, None] + t0[None, :]))


def sq_err(x: np.ndarray, xstar: np.ndarray) -> np.ndarray:
    """Squared error per run and agent, (R, n); a central x of shape (R, d) is compared with every agent's x*."""
    if x.ndim == 2:
        x = x[:, None, :]
    return ((x - xstar) ** 2).sum(-1)
