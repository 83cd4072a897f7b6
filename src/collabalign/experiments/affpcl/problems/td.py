"""Personalised TD(0) as in the theory (spec §3.13, App. C.6, footnote 5), as an AffPCL problem (problem.py).

Agent i is a Markov reward process (P^i, R^i, gamma) on S states; samples are i.i.d. transitions s = (o, o') ~
mu^i(o, o') = pi^i(o) P^i(o'|o) with pi^i the exact stationary distribution; A(s) = phi(o) (phi(o) - gamma phi(o'))^T,
b^i(s) = phi(o) R^i(o, o'); the reference is the exact TD fixed point x^i_* = (Abar^i)^{-1} bbar^i, and the density
ratios rho^i = mu^i / mu^0 are exact. The central objective is tabular in (o, o'): b^c(s) = phi(o) theta^c[o, o'],
learned by COE as the pooled running mean reward of each transition (whose limit is sum_i mu^i R^i / sum_i mu^i, the
solution of eq. 6), or given (oracle).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collabalign.experiments.affpcl.problems.rl import categorical, perturbed, pooled_mean, stationary
from collabalign.methods.affpcl.problem import sq_err


class Transitions(NamedTuple):
    k: np.ndarray  # transition indices k = o S + o' (R, n)
    r: np.ndarray  # each agent's own reward R^i(o, o') (R, n)
    f: np.ndarray  # phi(o) (R, n, d)
    df: np.ndarray  # phi(o) - gamma phi(o') (R, n, d)
    b: np.ndarray  # b^i(s) = phi(o) R^i(o, o') (R, n, d)


class TDCentral(NamedTuple):
    theta: np.ndarray  # the central reward per transition (R, S*S)
    visits: np.ndarray  # pooled visits per transition (R, S*S)
    learn: bool  # False: the COE limit given (oracle)


class TabularChains:
    """R runs of n Markov reward processes on S states with features phi (R, S, d): tabular (phi = e_o) or random unit
    vectors. Exact stationary pi (R, n, S), transition laws mu (R, n, S*S), ratios rho (R, n, S*S), TD fixed points
    xstar (R, n, d), the central x_c (R, d) and the COE limit theta_c (R, S*S)."""

    def __init__(self, rng: np.random.Generator, runs: int, n: int, states: int = 10, gamma: float = 0.5,
                 delta_env: float = 0.0, delta_obj: float = 0.0, features: str = "tabular", d: int = 5):
        self.runs, self.n, self.states, self.gamma = runs, n, states, gamma
        base_p = rng.uniform(size=(runs, states, states))
        base_p /= base_p.sum(-1, keepdims=True)
        base_r = rng.uniform(size=(runs, states, states))
        self.p, self.r = perturbed(rng, base_p, base_r, runs, n, delta_env, delta_obj)
        if features == "tabular":
            self.phi = np.broadcast_to(np.eye(states), (runs, states, states)).copy()
        else:
            z = rng.standard_normal((runs, states, d))
            self.phi = z / np.linalg.norm(z, axis=-1, keepdims=True)
        self.d = self.phi.shape[-1]
        self.pi = stationary(self.p)
        self.mu = (self.pi[..., :, None] * self.p).reshape(runs, n, states * states)
        self.rho = self.mu / self.mu.mean(1, keepdims=True)
        self.cum = np.cumsum(self.mu, axis=-1)
        o, o2 = np.divmod(np.arange(states * states), states)
        f, f2 = self.phi[:, o], self.phi[:, o2]  # (R, S*S, d)
        self.abar = np.einsum("rnk,rkd,rke->rnde", self.mu, f, f - gamma * f2)
        self.bbar = np.einsum("rnk,rkd,rnk->rnd", self.mu, f, self.r.reshape(runs, n, -1))
        self.xstar = np.linalg.solve(self.abar, self.bbar[..., None])[..., 0]
        self.x_c = np.linalg.solve(self.abar.mean(1), self.bbar.mean(1)[..., None])[..., 0]
        self.theta_c = (self.mu * self.r.reshape(runs, n, -1)).sum(1) / self.mu.sum(1)

    def a_mul(self, batch: Transitions, x: np.ndarray) -> np.ndarray:
        """A(s) x for every agent's transition, x (R, n, d) or (R, d)."""
        xx = x if x.ndim == 3 else x[:, None]
        return batch.f * (batch.df * xx).sum(-1, keepdims=True)

    # the problem interface (problem.py)

    def draw(self, steps: int, rng: np.random.Generator) -> np.ndarray:
        """Uniforms of every agent's transition, (T, R, n)."""
        return rng.uniform(size=(steps, self.runs, self.n))

    def sample(self, draws: np.ndarray, t: int, models: np.ndarray) -> Transitions:
        k = categorical(self.cum, draws[t])
        o, o2 = np.divmod(k, self.states)
        f = np.take_along_axis(self.phi, o[..., None], axis=1)
        f2 = np.take_along_axis(self.phi, o2[..., None], axis=1)
        r = np.take_along_axis(self.r.reshape(self.runs, self.n, -1), k[..., None], axis=-1)[..., 0]
        return Transitions(k, r, f, f - self.gamma * f2, f * r[..., None])

    def grad(self, x: np.ndarray, batch: Transitions) -> np.ndarray:
        return self.a_mul(batch, x) - batch.b

    def error(self, models: np.ndarray) -> np.ndarray:
        return sq_err(models, self.xstar)

    def central_start(self, central: str, weights: str) -> TDCentral:
        if weights != "exact":
            raise ValueError(f"tabular chains: unknown density ratios {weights!r}")
        cells = self.states**2
        theta = self.theta_c.copy() if central == "oracle" else np.zeros((self.runs, cells))
        return TDCentral(theta, np.zeros((self.runs, cells)), central == "coe")

    def bias_correction(self, xc: np.ndarray, est: TDCentral, batch: Transitions) -> np.ndarray:
        return self.a_mul(batch, xc) - batch.f * np.take_along_axis(est.theta, batch.k, axis=1)[..., None]

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: TDCentral, batch: Transitions,
                             x: np.ndarray, weights: str) -> np.ndarray:
        rho = np.take_along_axis(self.rho, np.broadcast_to(batch.k[:, None], (self.runs, self.n, self.n)), axis=2)
        return np.einsum("rij,rjd->rid", rho, corr) / self.n

    def coe(self, est: TDCentral, batch: Transitions, a: np.ndarray) -> TDCentral:
        """theta^c: the pooled running mean reward of each transition."""
        if not est.learn:
            return est
        return TDCentral(*pooled_mean(est.theta, est.visits, batch.k, batch.r), True)
