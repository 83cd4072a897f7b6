"""Plain per-run, per-agent loops of IL, FedAvg and AffPCL on the Gaussian systems: a transcription of spec §3 with
explicit matrices A(s), Phi(s) and Gaussian densities, used to check the one vectorised update rule and as the
benchmark's baseline. Same system and generator -> the same noise draws as the vectorised driver."""

from __future__ import annotations

import math

import numpy as np

from collabalign.methods.affpcl.algorithm import Cdl, schedule
from collabalign.methods.affpcl.systems import GaussianSystems


def _a(system: GaussianSystems, r: int, s: np.ndarray) -> np.ndarray:
    return (np.eye(system.d) + system.eps_a * np.outer(s, s)) @ system.a_base[r]


def _phi(system: GaussianSystems, r: int, s: np.ndarray) -> np.ndarray:
    return (np.eye(system.d) + system.eps_b * np.outer(s, s)) @ system.phi_base[r]


def _density(mean: np.ndarray, s: np.ndarray) -> float:
    return math.exp(-0.5 * float((s - mean) @ (s - mean)))


def reference_il(system: GaussianSystems, steps: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Independent learning, one agent at a time."""
    noise, a = system.draw(steps, rng), schedule(alpha, steps, system.runs)
    err = np.empty((steps, system.runs, system.n))
    for r in range(system.runs):
        for i in range(system.n):
            x = np.zeros(system.d)
            for t in range(steps):
                s = system.means[r, i] + noise[t, r, i]
                x = x - a[t, r] * (_a(system, r, s) @ x - _phi(system, r, s) @ system.theta[r, i])
                err[t, r, i] = float((x - system.xstar[r, i]) @ (x - system.xstar[r, i]))
    return err


def reference_fedavg(system: GaussianSystems, steps: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """FedAvg with one local step per round, one run at a time."""
    noise, a = system.draw(steps, rng), schedule(alpha, steps, system.runs)
    err = np.empty((steps, system.runs, system.n))
    for r in range(system.runs):
        xc = np.zeros(system.d)
        for t in range(steps):
            grads = []
            for i in range(system.n):
                s = system.means[r, i] + noise[t, r, i]
                grads.append(_a(system, r, s) @ xc - _phi(system, r, s) @ system.theta[r, i])
            xc = xc - a[t, r] * sum(grads) / system.n
            for i in range(system.n):
                err[t, r, i] = float((xc - system.xstar[r, i]) @ (xc - system.xstar[r, i]))
    return err


def reference_affpcl(system: GaussianSystems, steps: int, alpha: float, rng: np.random.Generator,
                     cdl: Cdl = "22-1", weights: str = "exact") -> np.ndarray:
    """AffPCL with COE, Algorithm 1 as corrected in spec §3.8, one run and one agent at a time."""
    noise, a = system.draw(steps, rng), schedule(alpha, steps, system.runs)
    n, d = system.n, system.d
    err = np.empty((steps, system.runs, n))
    for r in range(system.runs):
        x = [np.zeros(d) for _ in range(n)]
        xc, th = np.zeros(d), np.zeros(d)
        mean_sum = [np.zeros(d) for _ in range(n)]
        for t in range(steps):
            s = [system.means[r, i] + noise[t, r, i] for i in range(n)]
            a_s = [_a(system, r, s[i]) for i in range(n)]
            phi_s = [_phi(system, r, s[i]) for i in range(n)]
            b = [phi_s[i] @ system.theta[r, i] for i in range(n)]
            corr = [a_s[j] @ xc - phi_s[j] @ th for j in range(n)]
            means = _weight_means(system, r, weights, mean_sum, t)
            mu0 = None if means is None else [sum(_density(m, s[j]) for m in means) / n for j in range(n)]
            new_x = []
            for i in range(n):
                server = np.zeros(d)
                for j in range(n):
                    rho = 1.0 if mu0 is None else _density(means[i], s[j]) / mu0[j]
                    server += rho * corr[j] / n
                new_x.append(x[i] - a[t, r] * (a_s[i] @ x[i] - b[i] + server - corr[i]))
            g_c = sum((a_s[i] @ xc - b[i]) if cdl == "22-1" else corr[i] for i in range(n)) / n
            g_b = sum(phi_s[i] @ th - b[i] for i in range(n)) / n
            x, xc, th = new_x, xc - a[t, r] * g_c, th - a[t, r] * g_b
            for i in range(n):
                mean_sum[i] = mean_sum[i] + s[i]
                err[t, r, i] = float((x[i] - system.xstar[r, i]) @ (x[i] - system.xstar[r, i]))
    return err


def _weight_means(system: GaussianSystems, r: int, weights: str, mean_sum: list[np.ndarray], t: int
                  ) -> list[np.ndarray] | None:
    """The Gaussian means the density ratios use (true or running sample means), or None for unit weights."""
    if weights == "exact":
        return list(system.means[r])
    if weights == "none" or t == 0:
        return None
    return [m / t for m in mean_sum]
