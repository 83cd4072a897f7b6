"""AffPCL (Algorithm 1 with the eq. 8 fixes of spec §9 items 1-2), vectorised over runs and agents.

Per step every agent draws one sample, shared by all modules; all modules update simultaneously from time-t values:
  x^c   <- x^c   - a * g^{0,c}                               CDL, (22-1) or (22-2)
  th^c  <- th^c  - a * (1/n) sum_i (Phi(s^i) th^c - b^i(s^i))  COE, eq. (7); or th^c fixed at theta^c_* ("oracle")
  x^i   <- x^i   - a * (g^i(x^i) + (1/n) sum_j rho^i(s^j) g^{c->j}(x^c) - g^{c->i}(x^c)),
with g^{c->j}(x) = A(s^j) x - Phi(s^j) th^c. The importance-corrected sum is one batched matrix product per step.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from collabalign.methods.affpcl.common import draw_noise, schedule, sq_err
from collabalign.methods.affpcl.systems import GaussianSystems

Central = Literal["coe", "oracle"]
Cdl = Literal["22-1", "22-2"]
Weights = Literal["exact", "none", "estimated"]


def importance_weights(system: GaussianSystems, s: np.ndarray, weights: Weights, mean_sum: np.ndarray,
                       t: int) -> np.ndarray:
    """rho^i(s^j) as (R, n, n): exact; none (all ones, no importance correction); or estimated by plugging the
    agents' running sample means of steps < t into the Gaussian ratio (identity covariance known; all ones at t = 0)."""
    if weights == "exact":
        return system.rho(s)
    if weights == "none" or t == 0:
        return np.ones((system.runs, system.n, system.n))
    return system.rho(s, means=mean_sum / t)


def run_affpcl(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator,
               central: Central = "coe", cdl: Cdl = "22-1", weights: Weights = "exact") -> np.ndarray:
    """Squared errors ||x^i_t - x^i_*||^2 after each step, (T, R, n); every variable starts at zero."""
    noise = draw_noise(system, steps, rng)
    a_all = schedule(alpha, steps, system.runs)
    runs, n, d = system.runs, system.n, system.d
    x, xc = np.zeros((runs, n, d)), np.zeros((runs, d))
    th = system.theta_c.copy() if central == "oracle" else np.zeros((runs, d))
    mean_sum = np.zeros((runs, n, d))
    err = np.empty((steps, runs, n))
    for t in range(steps):
        s, a = system.sample(noise[t]), a_all[t][:, None]
        b = system.b(s)
        bc = system.phi_mul(s, th)
        axc = system.a_mul(s, xc)
        corr = axc - bc  # g^{c->j}(x^c): the control variate and the summand of the importance-corrected term
        rho = importance_weights(system, s, weights, mean_sum, t)
        server = np.einsum("rij,rjd->rid", rho, corr) / n
        x = x - a[..., None] * (system.a_mul(s, x) - b + server - corr)
        g_c = (axc - b if cdl == "22-1" else corr).mean(1)
        if central == "coe":
            th = th - a * (bc - b).mean(1)
        xc = xc - a * g_c
        mean_sum += s
        err[t] = sq_err(x, system.xstar)
    return err
