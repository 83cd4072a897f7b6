"""Linear systems whose noise in A(s) is misaligned with its mean, so that the noise alignment constant nu (Def. 3) is
set by one knob (spec §7.2 item 8): a problem of the interface in problem.py, vectorised over R runs and n agents.

Agent i samples s = (xi, z): a fair sign xi and z ~ N(0, I_d), the same law for every agent (no environment
heterogeneity, so every density ratio is 1: AffPCL runs with weights "none"). It observes A(s) = Abar + kappa xi N and
b^i(s) = theta^i + sigma z. Abar is drawn as the Gaussian systems' A_base (SPD, well conditioned) and N is a random
orthogonal matrix scaled to ||Abar||, so D(s) = |Abar +- kappa N|, and nu = ||Dbar Abar^{-1}|| is 1 at kappa = 0 and
grows with kappa, while the objectives (theta^i = theta_base + delta_obj u_i, unit theta_base, u_1 = 0) stay fixed.
The central objective is the oracle b^c(s) = mean_i theta^i + sigma z (b^i - b^c does not depend on s).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collabalign.methods.affpcl.problem import sq_err


class SignBatch(NamedTuple):
    xi: np.ndarray  # each agent's sign (R, n)
    z: np.ndarray  # its objective noise (R, n, d)


class MisalignedSystems:
    """R instances of the n-agent system at one (kappa, delta_obj); all randomness from `rng`."""

    def __init__(self, rng: np.random.Generator, runs: int, n: int, kappa: float, delta_obj: float, d: int = 5,
                 sigma: float = 0.5):
        self.runs, self.n, self.d, self.kappa, self.sigma = runs, n, d, kappa, sigma
        t = rng.uniform(size=(runs, d, d))
        self.abar = t.transpose(0, 2, 1) @ t + d * np.eye(d)
        q = np.linalg.qr(rng.standard_normal((runs, d, d)))[0]
        self.noise = q * np.linalg.norm(self.abar, ord=2, axis=(1, 2))[:, None, None]
        u = rng.standard_normal((runs, n, d))
        u /= np.linalg.norm(u, axis=-1, keepdims=True)
        u[:, 0] = 0.0
        base = rng.standard_normal((runs, 1, d))
        self.theta = base / np.linalg.norm(base, axis=-1, keepdims=True) + delta_obj * u
        self.theta_c = self.theta.mean(1)
        self.xstar = np.linalg.solve(self.abar[:, None], self.theta[..., None])[..., 0]
        self.lam = np.linalg.eigvalsh(self.abar)[:, 0]  # Abar is symmetric: lambda per run, (R,)

    def nu(self) -> np.ndarray:
        """nu = ||Dbar Abar^{-1}|| per run (Def. 3), exact: Dbar averages sqrt(A^T A) over the two signs."""
        dbar = 0.5 * sum(_psd_sqrt(np.swapaxes(a, 1, 2) @ a)
                         for a in (self.abar + self.kappa * self.noise, self.abar - self.kappa * self.noise))
        return np.linalg.norm(dbar @ np.linalg.inv(self.abar), ord=2, axis=(1, 2))

    def a_mul(self, xi: np.ndarray, x: np.ndarray) -> np.ndarray:
        """A(s) x for every agent's sign (R, n) and x per agent (R, n, d) or common (R, d)."""
        x = x[:, None] if x.ndim == 2 else x
        return (np.einsum("rkl,rnl->rnk", self.abar, x)
                + self.kappa * xi[..., None] * np.einsum("rkl,rnl->rnk", self.noise, x))

    # the problem interface (problem.py): one fresh sample per agent and step

    def draw(self, steps: int, rng: np.random.Generator) -> SignBatch:
        """Every step's signs (T, R, n) and objective noise (T, R, n, d), drawn up front."""
        xi = 2.0 * rng.integers(2, size=(steps, self.runs, self.n)) - 1.0
        return SignBatch(xi, rng.standard_normal((steps, self.runs, self.n, self.d)))

    def sample(self, draws: SignBatch, t: int, models: np.ndarray) -> SignBatch:
        return SignBatch(draws.xi[t], draws.z[t])

    def grad(self, x: np.ndarray, batch: SignBatch) -> np.ndarray:
        return self.a_mul(batch.xi, x) - self.theta - self.sigma * batch.z

    def error(self, models: np.ndarray) -> np.ndarray:
        return sq_err(models, self.xstar)

    def central_start(self, central: str, weights: str) -> None:
        if central != "oracle" or weights != "none":
            raise ValueError("misaligned systems: the oracle central objective and no density ratios only")
        return None

    def bias_correction(self, xc: np.ndarray, est: None, batch: SignBatch) -> np.ndarray:
        return self.a_mul(batch.xi, xc) - self.theta_c[:, None] - self.sigma * batch.z

    def coe(self, est: None, batch: SignBatch, a: np.ndarray) -> None:
        return None


def _psd_sqrt(m: np.ndarray) -> np.ndarray:
    """Square root of a stack of symmetric positive semi-definite matrices."""
    w, v = np.linalg.eigh(m)
    return (v * np.sqrt(np.maximum(w, 0.0))[..., None, :]) @ np.swapaxes(v, -1, -2)
