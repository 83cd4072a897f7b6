"""Gaussian linear systems of the AffPCL paper (spec docs/methods/affpcl.md §5.1): a batch of independent
instances (runs), each with n agents, controllable environment and objective heterogeneity and exact references.

Agent i samples s ~ N(m_i, I_d) and observes A(s) = (I + eps_A s s^T) A_base and b^i(s) = Phi(s) theta^i with
Phi(s) = (I + eps_b s s^T) Phi_base. Because E[s s^T] = I + m m^T, every mean and every solution is closed form.
Arrays carry a leading run dimension R and, where per agent, an agent dimension n: (R, n, d). The systems implement
the problem interface of problem.py: COE learns theta^c with Phi(s) (eq. 7); the density ratios are exact or plug the
agents' running sample means into the Gaussian ratio (identity covariance known).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp, ndtr

from collabalign.methods.affpcl.problem import sq_err

C_A = 4.0  # ||m_i|| = 4 delta_env: the paper's environment scale


class GaussianBatch(NamedTuple):
    s: np.ndarray  # each agent's sample (R, n, d)
    b: np.ndarray  # its own objective b^i(s^i) (R, n, d)


class GaussianCentral(NamedTuple):
    theta: np.ndarray  # COE's theta^c (R, d)
    learn: bool  # False: theta^c_* given (oracle)
    sample_sum: np.ndarray  # the agents' summed samples of earlier steps (R, n, d), for estimated ratios
    count: int


class GaussianSystems:
    """R independent instances of the n-agent system at one (delta_env, delta_obj); all randomness from `rng`."""

    def __init__(self, rng: np.random.Generator, runs: int, n: int, d: int = 5, delta_env: float = 0.0,
                 delta_obj: float = 0.0, eps_a: float = 1.0, eps_b: float = 0.5, normalise_theta: bool = True):
        self.runs, self.n, self.d = runs, n, d
        self.delta_env, self.delta_obj, self.eps_a, self.eps_b = delta_env, delta_obj, eps_a, eps_b
        self.a_base = np.empty((runs, d, d))
        self.phi_base = np.empty((runs, d, d))
        self.means = np.empty((runs, n, d))
        self.theta = np.empty((runs, n, d))
        todo = np.arange(runs)
        while todo.size:  # sym(Abar^i) > 0 is not guaranteed for a product of SPD matrices (§9 item 6): redraw
            self._draw(rng, todo, normalise_theta)
            todo = todo[self.lambda_min_sym(self.abar[todo]).min(axis=1) <= 0]

    def _draw(self, rng: np.random.Generator, idx: np.ndarray, normalise_theta: bool) -> None:
        """Draws instances `idx` (§5.1 steps 1-3) and recomputes every closed-form reference."""
        k, n, d = idx.size, self.n, self.d
        t_a = rng.uniform(size=(k, d, d))
        t_phi = rng.standard_normal((k, d, d))
        self.a_base[idx] = t_a.transpose(0, 2, 1) @ t_a + d * np.eye(d)
        self.phi_base[idx] = t_phi.transpose(0, 2, 1) @ t_phi + d * np.eye(d)
        v, u = _unit(rng, (k, n, d)), _unit(rng, (k, n, d))
        v[:, 0] = u[:, 0] = 0.0  # agent 1 is the reference agent: mu^1 = N(0, I), theta^1 = theta_base
        base = rng.standard_normal((k, 1, d))
        if normalise_theta:
            base /= np.linalg.norm(base, axis=-1, keepdims=True)
        self.means[idx] = C_A * self.delta_env * v
        self.theta[idx] = base + self.delta_obj * u
        self._references()

    def _references(self) -> None:
        """Exact Abar^i, Phibar^i, bbar^i, x*^i and the central system (eq. 3 and eq. 6)."""
        eye = np.eye(self.d)
        second = eye + self.means[..., :, None] * self.means[..., None, :]  # E[s s^T] per agent, (R, n, d, d)
        self.abar = (eye + self.eps_a * second) @ self.a_base[:, None]
        self.phibar = (eye + self.eps_b * second) @ self.phi_base[:, None]
        self.bbar = np.einsum("rnkl,rnl->rnk", self.phibar, self.theta)
        self.xstar = np.linalg.solve(self.abar, self.bbar[..., None])[..., 0]
        self.theta_c = np.linalg.solve(self.phibar.mean(1), self.bbar.mean(1)[..., None])[..., 0]
        self.x_c = np.linalg.solve(self.abar.mean(1), self.bbar.mean(1)[..., None])[..., 0]
        self.lam = self.lambda_min_sym(self.abar).min(axis=1)  # lambda per run (min over agents), (R,)

    def tile(self, copies: int) -> GaussianSystems:
        """A system whose runs are `copies` copies of run 0: many independent draws of one instance at once (Monte Carlo
        checks)."""
        out = object.__new__(GaussianSystems)
        out.__dict__.update({k: np.repeat(v[:1], copies, axis=0) if isinstance(v, np.ndarray) else v
                             for k, v in self.__dict__.items()})
        out.runs = copies
        return out

    @staticmethod
    def lambda_min_sym(mats: np.ndarray) -> np.ndarray:
        """Smallest eigenvalue of sym(M) for a stack of matrices (the strong-monotonicity constant)."""
        return np.linalg.eigvalsh(0.5 * (mats + np.swapaxes(mats, -1, -2)))[..., 0]

    def sample_from(self, noise: np.ndarray) -> np.ndarray:
        """Agents' samples s = m + z from standard normal noise z of shape (R, n, d)."""
        return self.means + noise

    def a_mul(self, s: np.ndarray, x: np.ndarray) -> np.ndarray:
        """A(s) x for samples (R, n, d) and x (R, n, d) or (R, d), in O(d^2) without forming A(s)."""
        return _mul(self.a_base, self.eps_a, s, x)

    def phi_mul(self, s: np.ndarray, theta: np.ndarray) -> np.ndarray:
        """Phi(s) theta, shaped like `a_mul`."""
        return _mul(self.phi_base, self.eps_b, s, theta)

    def b(self, s: np.ndarray) -> np.ndarray:
        """Each agent's own objective at its own sample, b^i(s^i) = Phi(s^i) theta^i."""
        return self.phi_mul(s, self.theta)

    def log_density(self, s: np.ndarray, means: np.ndarray | None = None) -> np.ndarray:
        """log mu^i(s^j) up to a shared constant: entry [r, i, j] for samples (R, n, d) and means (R, n, d)."""
        means = self.means if means is None else means
        diff = s[:, None, :, :] - means[:, :, None, :]
        return -0.5 * np.einsum("rijd,rijd->rij", diff, diff)

    def rho(self, s: np.ndarray, means: np.ndarray | None = None) -> np.ndarray:
        """Density ratios R[r, i, j] = rho^i(s^j) = mu^i(s^j) / mu^0(s^j), by log-sum-exp (§9 item 18)."""
        logp = self.log_density(s, means)
        return np.exp(logp - logsumexp(logp, axis=1, keepdims=True) + np.log(self.n))

    # the problem interface (problem.py): one fresh sample per agent and step

    def draw(self, steps: int, rng: np.random.Generator) -> np.ndarray:
        """All standard-normal sample noise of a run up front, (T, R, n, d)."""
        return rng.standard_normal((steps, self.runs, self.n, self.d))

    def sample(self, draws: np.ndarray, t: int, models: np.ndarray) -> GaussianBatch:
        s = self.sample_from(draws[t])
        return GaussianBatch(s, self.b(s))

    def grad(self, x: np.ndarray, batch: GaussianBatch) -> np.ndarray:
        return self.a_mul(batch.s, x) - batch.b

    def error(self, models: np.ndarray) -> np.ndarray:
        return sq_err(models, self.xstar)

    def central_start(self, central: str, weights: str) -> GaussianCentral:
        theta = self.theta_c.copy() if central == "oracle" else np.zeros((self.runs, self.d))
        return GaussianCentral(theta, central == "coe", np.zeros((self.runs, self.n, self.d)), 0)

    def bias_correction(self, xc: np.ndarray, est: GaussianCentral, batch: GaussianBatch) -> np.ndarray:
        return self.a_mul(batch.s, xc) - self.phi_mul(batch.s, est.theta)

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: GaussianCentral, batch: GaussianBatch,
                             x: np.ndarray, weights: str) -> np.ndarray:
        """rho^i(s^j) exact, or ("estimated") from the running sample means of steps < t (all ones at t = 0)."""
        if weights == "exact":
            rho = self.rho(batch.s)
        elif weights == "estimated":
            rho = self.rho(batch.s, est.sample_sum / est.count) if est.count else np.ones((self.runs, self.n, self.n))
        else:
            raise ValueError(f"Gaussian systems: unknown density ratios {weights!r}")
        return np.einsum("rij,rjd->rid", rho, corr) / self.n

    def coe(self, est: GaussianCentral, batch: GaussianBatch, a: np.ndarray) -> GaussianCentral:
        """theta^c <- theta^c - a (1/n) sum_i (Phi(s^i) theta^c - b^i(s^i)) (eq. 7), and the sample sums."""
        theta = est.theta - a[:, None] * (self.phi_mul(batch.s, est.theta) - batch.b).mean(1) if est.learn \
            else est.theta
        return GaussianCentral(theta, est.learn, est.sample_sum + batch.s, est.count + 1)

    def cluster_loss(self, w: np.ndarray, recent: tuple[GaussianBatch, ...] | None) -> np.ndarray:
        """IFCA's loss of every cluster model w (R, K, d) for every agent, (R, n, K): exact ||Abar^i w_k - bbar^i||^2
        (recent None), or ||A(s) w_k - b^i(s)||^2 averaged over the agent's recent samples (the reference scripts'
        version always picked cluster 0)."""
        if recent is None:
            res = np.einsum("rnkl,rcl->rnck", self.abar, w) - self.bbar[:, :, None]
            return (res**2).sum(-1)
        wins, k = len(recent), w.shape[1]
        s = np.stack([b.s for b in recent], 2).reshape(self.runs, self.n * wins, self.d)  # row i * wins + j
        s_k = np.repeat(s, k, axis=1)
        w_k = np.tile(w, (1, self.n * wins, 1))
        theta = np.repeat(self.theta, wins * k, axis=1)
        res = self.a_mul(s_k, w_k) - self.phi_mul(s_k, theta)
        return (res**2).sum(-1).reshape(self.runs, self.n, wins, k).mean(2)


def _unit(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Uniform random unit vectors along the last axis."""
    z = rng.standard_normal(shape)
    return z / np.linalg.norm(z, axis=-1, keepdims=True)


def _mul(base: np.ndarray, eps: float, s: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(I + eps s s^T) base x, broadcasting a central x (R, d) over the agents."""
    bx = np.einsum("rkl,r...l->r...k", base, x)
    if bx.ndim == 2:
        bx = bx[:, None, :]
    return bx + eps * s * np.einsum("rnd,rnd->rn", s, bx)[..., None]


def tv_gaussians(distance: np.ndarray) -> np.ndarray:
    """Total variation between N(m, I) and N(m', I) at ||m - m'|| = distance: 2 Phi(distance / 2) - 1."""
    return 2.0 * ndtr(distance / 2.0) - 1.0


def heterogeneity(system: GaussianSystems, rng: np.random.Generator, samples: int = 4000) -> dict[str, np.ndarray]:
    """Realised heterogeneity per run (§5.1 item 7): delta_env by Def. 2 (exact TV), delta_obj by Def. 1 under the
    linear parametrisation, delta_env^i = TV(mu^i, mu^0) by Monte Carlo, and delta_cen^i (Lemma D.1).

    Gaussian s is unbounded (§9 item 9), so G_b in delta_cen^i is taken as max_j ||bbar^j||, a finite stand-in.
    """
    m, theta = system.means, system.theta
    dist = np.linalg.norm(m[:, :, None] - m[:, None, :], axis=-1)
    g_b = np.maximum(np.linalg.norm(theta, axis=-1).max(1), np.linalg.norm(system.theta_c, axis=-1))
    dtheta = np.linalg.norm(theta[:, :, None] - theta[:, None, :], axis=-1)
    # draws from mu^0: a uniformly chosen agent's Gaussian
    who = rng.integers(system.n, size=(system.runs, samples))
    s0 = np.take_along_axis(m, who[..., None], axis=1) + rng.standard_normal((system.runs, samples, system.d))
    logp = system.log_density(s0)
    rho = np.exp(logp - logsumexp(logp, axis=1, keepdims=True) + np.log(system.n))  # (R, n, samples)
    env_i = 0.5 * np.abs(rho - 1.0).mean(-1)
    bbar0 = system.bbar.mean(1, keepdims=True)
    obj_i = np.linalg.norm(system.bbar - bbar0, axis=-1) / (2 * np.linalg.norm(system.bbar, axis=-1).max(1))[:, None]
    return {"delta_env_tv": tv_gaussians(dist).max((1, 2)), "delta_obj": dtheta.max((1, 2)) / (2 * g_b),
            "delta_env_i": env_i, "delta_cen_i": np.maximum(env_i, obj_i)}


def noise_alignment(system: GaussianSystems, rng: np.random.Generator, samples: int = 500) -> np.ndarray:
    """nu = max_i ||Dbar^i (Abar^i)^{-1}|| per run (Def. 3), Dbar^i = E sqrt(A(s)^T A(s)) by Monte Carlo (§3.11)."""
    eye = np.eye(system.d)
    s = system.means[:, :, None] + rng.standard_normal((system.runs, system.n, samples, system.d))
    a = (eye + system.eps_a * s[..., :, None] * s[..., None, :]) @ system.a_base[:, None, None]
    w, vecs = np.linalg.eigh(np.swapaxes(a, -1, -2) @ a)
    root = (vecs * np.sqrt(np.maximum(w, 0.0))[..., None, :]) @ np.swapaxes(vecs, -1, -2)
    dbar = root.mean(2)
    return np.linalg.norm(dbar @ np.linalg.inv(system.abar), ord=2, axis=(-2, -1)).max(1)
