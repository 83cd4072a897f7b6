"""AffPCL in reinforcement learning (spec §3.13, §5.3, §8.4), vectorised over runs and agents; loops over time only.

(a) Personalised TD(0) as in the theory (App. C.6, footnote 5): agent i is a Markov reward process (P^i, R^i, gamma)
on S states; samples are i.i.d. transitions s = (o, o') ~ mu^i(o, o') = pi^i(o) P^i(o'|o) with pi^i the exact
stationary distribution; A(s) = phi(o) (phi(o) - gamma phi(o'))^T, b^i(s) = phi(o) R^i(o, o'); the reference is the
exact TD fixed point x^i_* = (Abar^i)^{-1} bbar^i, and the density ratios rho^i = mu^i / mu^0 are exact.
The central objective is tabular in (o, o'): b^c(s) = phi(o) theta^c[o, o'], learned by COE as the pooled running
mean reward of each transition (whose limit is sum_i mu^i R^i / sum_i mu^i, the solution of eq. 6), or given (oracle).

(b) AffPCL-SARSA, the reference scripts' `rl.py` (§3.13): tabular MDPs, linear Q features, softmax behaviour
policies on the current parameters, Markovian trajectories; importance weights from the reference policies' exact
stationary state-action distributions ("true rho") or from tabular density-ratio estimation (visitation counts times
the current policies, "DRE").

Heterogeneity (§5.3): P^i = normalise(P_base + delta_env U[0, 1]) and R^i = R_base + delta_obj U[-1, 1] for i >= 2,
agent 1 being the base system.
"""

from __future__ import annotations

import numpy as np

TD_METHODS = ("il", "fedavg", "affpcl")
SARSA_METHODS = ("il", "fedavg", "affpcl", "affpcl_dre")


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


def _perturbed(rng: np.random.Generator, base_p: np.ndarray, base_r: np.ndarray, runs: int, n: int,
               delta_env: float, delta_obj: float) -> tuple[np.ndarray, np.ndarray]:
    """Agents' kernels and rewards (R, n, ...) from per-run bases (R, ...); agent 1 keeps the base (§5.3)."""
    p = base_p[:, None] + delta_env * rng.uniform(size=(runs, n, *base_p.shape[1:]))
    r = base_r[:, None] + delta_obj * rng.uniform(-1, 1, size=(runs, n, *base_r.shape[1:]))
    p[:, 0], r[:, 0] = base_p, base_r
    p = np.maximum(p, 0.0)
    return p / p.sum(-1, keepdims=True), r


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
        self.p, self.r = _perturbed(rng, base_p, base_r, runs, n, delta_env, delta_obj)
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

    def sample(self, u: np.ndarray) -> np.ndarray:
        """Transition indices k = o S + o' (R, n) from uniforms (R, n)."""
        return categorical(self.cum, u)

    def a_mul(self, k: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A(s) x for transitions k (R, n) and x (R, n, d) or (R, d); also phi(o) (R, n, d)."""
        o, o2 = np.divmod(k, self.states)
        f = np.take_along_axis(self.phi, o[..., None], axis=1)
        f2 = np.take_along_axis(self.phi, o2[..., None], axis=1)
        xx = x if x.ndim == 3 else x[:, None]
        return f * ((f - self.gamma * f2) * xx).sum(-1, keepdims=True), f

    def reward(self, k: np.ndarray) -> np.ndarray:
        """R^i(o, o') of each agent's own transition, (R, n)."""
        return np.take_along_axis(self.r.reshape(self.runs, self.n, -1), k[..., None], axis=-1)[..., 0]


def run_td(method: str, chains: TabularChains, steps: int, alpha: float, rng: np.random.Generator,
           central: str = "coe") -> np.ndarray:
    """Squared errors ||x^i_t - x^i_*||^2 (T, R, n) of independent TD(0), FedAvg TD(0) (the common model against each
    x^i_*) or personalised AffPCL TD(0) (CDL 22-1, exact rho, COE by pooled running means or the oracle theta_c)."""
    runs, n, d, cells = chains.runs, chains.n, chains.d, chains.states**2
    u = rng.uniform(size=(steps, runs, n))
    x, xc = np.zeros((runs, n, d)), np.zeros((runs, d))
    th = chains.theta_c.copy() if central == "oracle" else np.zeros((runs, cells))
    visits = np.zeros((runs, cells))
    err = np.empty((steps, runs, n))
    for t in range(steps):
        k = chains.sample(u[t])
        r = chains.reward(k)
        if method == "il":
            ax, f = chains.a_mul(k, x)
            x = x - alpha * (ax - f * r[..., None])
        elif method == "fedavg":
            ax, f = chains.a_mul(k, xc)
            xc = xc - alpha * (ax - f * r[..., None]).mean(1)
            x = np.broadcast_to(xc[:, None], x.shape)
        elif method == "affpcl":
            axc, f = chains.a_mul(k, xc)
            corr = axc - f * np.take_along_axis(th, k, axis=1)[..., None]  # g^{c->j}(x^c)
            rho = np.take_along_axis(chains.rho, np.broadcast_to(k[:, None], (runs, n, n)), axis=2)
            server = np.einsum("rij,rjd->rid", rho, corr) / n
            x = x - alpha * (chains.a_mul(k, x)[0] - f * r[..., None] + server - corr)
            xc = xc - alpha * (axc - f * r[..., None]).mean(1)
            if central == "coe":
                th, visits = _pooled_mean(th, visits, k, r)
        else:
            raise ValueError(f"unknown method {method!r}")
        err[t] = ((x - chains.xstar) ** 2).sum(-1)
    return err


def _pooled_mean(mean: np.ndarray, count: np.ndarray, cell: np.ndarray, value: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Running means per cell (R, C) after adding this step's values (R, n) at cells (R, n)."""
    runs, cells = mean.shape
    add_n, add_v = np.zeros((runs, cells)), np.zeros((runs, cells))
    rows = np.repeat(np.arange(runs), cell.shape[1])
    np.add.at(add_n, (rows, cell.ravel()), 1.0)
    np.add.at(add_v, (rows, cell.ravel()), value.ravel())
    new = count + add_n
    return np.where(add_n > 0, (mean * count + add_v) / np.maximum(new, 1e-300), mean), new


class TabularMDPs:
    """R runs of n MDPs (S states, A actions) with shared unit features phi (R, S, A, d) and the reference scripts'
    references: q* by value iteration, pi_ref = softmax(q* / temp), q^pi exactly, theta^i_* = pinv(Phi) q^pi, and the
    exact stationary state-action distribution d_sa of pi_ref (R, n, S, A)."""

    def __init__(self, rng: np.random.Generator, runs: int, n: int, states: int = 10, actions: int = 5, d: int = 20,
                 gamma: float = 0.1, temp: float = 10.0, delta_env: float = 0.0, delta_obj: float = 0.0,
                 sweeps: int = 1000):
        self.runs, self.n, self.states, self.actions, self.d = runs, n, states, actions, d
        self.gamma, self.temp = gamma, temp
        base_p = rng.uniform(size=(runs, states, actions, states))
        base_p /= base_p.sum(-1, keepdims=True)
        base_r = rng.uniform(size=(runs, states, actions))
        self.p, self.r = _perturbed(rng, base_p, base_r, runs, n, delta_env, delta_obj)
        z = rng.standard_normal((runs, states, actions, d))
        self.phi = z / np.linalg.norm(z, axis=-1, keepdims=True)
        q = np.zeros((runs, n, states, actions))
        for _ in range(sweeps):
            q = self.r + gamma * np.einsum("rnsat,rnt->rnsa", self.p, q.max(-1))
        pol = softmax(q / temp)
        sa = states * actions
        p_pi = np.einsum("rnsat,rntb->rnsatb", self.p, pol).reshape(runs, n, sa, sa)
        q_pi = np.linalg.solve(np.eye(sa) - gamma * p_pi, self.r.reshape(runs, n, sa, 1))[..., 0]
        flat = self.phi.reshape(runs, sa, d)
        self.theta_star = np.einsum("rds,rns->rnd", np.linalg.pinv(flat), q_pi)
        self.d_sa = stationary(p_pi).reshape(runs, n, states, actions)
        self.rho_true = self.d_sa / (self.d_sa.mean(1, keepdims=True) + 1e-9)
        self.cum_p = np.cumsum(self.p, axis=-1)

    def policy(self, theta: np.ndarray) -> np.ndarray:
        """Softmax policies (R, m, S, A) of parameters theta (R, m, d)."""
        return softmax(np.einsum("rsad,rmd->rmsa", self.phi, theta) / self.temp)

    def features(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        """phi(s, a) for index arrays (R, m), (R, m, d)."""
        return self.phi[np.arange(self.runs)[:, None], s, a]


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _act(mdps: TabularMDPs, theta: np.ndarray, s: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Actions (R, m) of the softmax policies of theta (R, m, d) at states s (R, m) from uniforms u (R, m)."""
    logits = np.einsum("rmad,rmd->rma", mdps.phi[np.arange(mdps.runs)[:, None], s], theta) / mdps.temp
    return categorical(np.cumsum(softmax(logits), -1), u)


def run_sarsa(method: str, mdps: TabularMDPs, steps: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    """Squared errors ||theta^i_t - theta^i_*||^2 (T, R, n) of independent SARSA, FedAvg SARSA (sync every step; the
    global parameter against each theta^i_*), AffPCL-SARSA with the reference policies' true rho, or with DRE."""
    runs, n, d, sa = mdps.runs, mdps.n, mdps.d, mdps.states * mdps.actions
    u = rng.uniform(size=(steps + 1, runs, n, 4))
    s = categorical(np.broadcast_to(np.linspace(1 / mdps.states, 1, mdps.states), (runs, n, mdps.states)),
                    u[-1, ..., 0])
    theta, thc = np.zeros((runs, n, d)), np.zeros((runs, d))
    r_c, n_c = np.zeros((runs, sa)), np.full((runs, sa), 1e-9)
    counts = np.ones((runs, n, mdps.states))
    rr = np.arange(runs)[:, None]
    err = np.empty((steps, runs, n))
    for t in range(steps):
        a = _act(mdps, theta, s, u[t, ..., 0])
        r = mdps.r[rr, np.arange(n), s, a]
        s2 = categorical(mdps.cum_p[rr, np.arange(n), s, a], u[t, ..., 1])
        a2 = _act(mdps, theta, s2, u[t, ..., 3])
        f = mdps.features(s, a)
        delta = r + mdps.gamma * (mdps.features(s2, a2) * theta).sum(-1) - (f * theta).sum(-1)
        local = delta[..., None] * f
        if method in ("affpcl", "affpcl_dre"):
            cell = s * mdps.actions + a
            r_c, n_c = _pooled_mean(r_c, n_c, cell, r)  # tabular COE: pooled mean reward, this step included
            a_c = _act(mdps, np.broadcast_to(thc[:, None], theta.shape), s2, u[t, ..., 2])
            dc = (np.take_along_axis(r_c, cell, axis=1) + mdps.gamma * (mdps.features(s2, a_c) * thc[:, None]).sum(-1)
                  - (f * thc[:, None]).sum(-1))
            gc = dc[..., None] * f
            if method == "affpcl":
                rho = mdps.rho_true
            else:
                dsa = (counts / counts.sum(-1, keepdims=True))[..., None] * mdps.policy(theta)
                rho = dsa / (dsa.mean(1, keepdims=True) + 1e-9)
            w = np.take_along_axis(rho.reshape(runs, n, sa), np.broadcast_to(cell[:, None], (runs, n, n)), axis=2)
            thc = thc + alpha * gc.mean(1)
            theta = theta + alpha * (local + np.einsum("rij,rjd->rid", w, gc) / n - gc)
        else:
            theta = theta + alpha * local
            if method == "fedavg":
                theta = np.broadcast_to(theta.mean(1, keepdims=True), theta.shape)
        counts[rr, np.arange(n), s2] += 1
        s = s2
        err[t] = ((theta - mdps.theta_star) ** 2).sum(-1)
    return err
