"""Tabular helpers shared by AffPCL's reinforcement-learning problems (spec §3.13, §5.3, §8.4): exact stationary laws,
inverse-CDF draws, the agents' perturbed kernels and rewards, pooled running means and the softmax.

Heterogeneity (§5.3): P^i = normalise(P_base + delta_env U[0, 1]) and R^i = R_base + delta_obj U[-1, 1] for i >= 2,
agent 1 being the base system.
"""

from __future__ import annotations

import numpy as np


def stationary(p: np.ndarray) -> np.ndarray:
    """Exact stationary distributions of row-stochastic matrices (..., S, S): solves pi (P - I) = 0, sum pi = 1."""
    s = p.shape[-1]
    lhs = np.swapaxes(p, -1, -2) - np.eye(s)
    lhs[..., -1, :] = 1.0
    rhs = np.zeros(p.shape[:-1])
    rhs[..., -1] = 1.0
    return np.linalg.solve(lhs, rhs[..., None])[..., 0]


def categorical(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws: indices of the first cumulative weight >= u, for cum (..., K) and u (...)."""
    return np.minimum((cum < u[..., None]).sum(-1), cum.shape[-1] - 1)


def perturbed(rng: np.random.Generator, base_p: np.ndarray, base_r: np.ndarray, runs: int, n: int,
              delta_env: float, delta_obj: float) -> tuple[np.ndarray, np.ndarray]:
    """Agents' kernels and rewards (R, n, ...) from per-run bases (R, ...); agent 1 keeps the base (§5.3)."""
    p = base_p[:, None] + delta_env * rng.uniform(size=(runs, n, *base_p.shape[1:]))
    r = base_r[:, None] + delta_obj * rng.uniform(-1, 1, size=(runs, n, *base_r.shape[1:]))
    p[:, 0], r[:, 0] = base_p, base_r
    p = np.maximum(p, 0.0)
    return p / p.sum(-1, keepdims=True), r


def pooled_mean(mean: np.ndarray, count: np.ndarray, cell: np.ndarray, value: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Running means per cell (R, C) after adding this step's values (R, n) at cells (R, n): tabular COE."""
    runs, cells = mean.shape
    add_n, add_v = np.zeros((runs, cells)), np.zeros((runs, cells))
    rows = np.repeat(np.arange(runs), cell.shape[1])
    np.add.at(add_n, (rows, cell.ravel()), 1.0)
    np.add.at(add_v, (rows, cell.ravel()), value.ravel())
    new = count + add_n
    return np.where(add_n > 0, (mean * count + add_v) / np.maximum(new, 1e-300), mean), new


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
