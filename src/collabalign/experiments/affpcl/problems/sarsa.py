"""AffPCL-SARSA, the reference scripts' `rl.py` (spec §3.13, §8.4), as an AffPCL problem (problem.py).

Tabular MDPs with linear Q features and softmax behaviour policies on the agents' current parameters; Markovian
trajectories. The local direction is the negative TD(0) direction g^i(theta) = -(r + gamma q(s', a') - q(s, a)) phi(s,
a); the central objective is COE's pooled running mean reward per (s, a), this step included; CDL uses the central
TD directions (22-2). Importance weights from the reference policies' exact stationary state-action distributions
("exact", the scripts' "true rho") or asynchronous density-ratio estimation ("dre": visitation counts times the
current policies).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collabalign.experiments.affpcl.problems.rl import categorical, perturbed, pooled_mean, softmax, stationary
from collabalign.methods.affpcl.problem import sq_err


class Trajectory:
    """One method's run: its uniforms (T + 1, R, n, 4), the agents' current states and state visitation counts
    (started at 1). The next states of a step are entered when the next step is sampled."""

    def __init__(self, u: np.ndarray, states: np.ndarray, counts: np.ndarray):
        self.u, self.states, self.counts = u, states, counts
        self.pending: np.ndarray | None = None


class SarsaStep(NamedTuple):
    s: np.ndarray  # states (R, n)
    a: np.ndarray  # behaviour actions (R, n)
    r: np.ndarray  # rewards (R, n)
    s2: np.ndarray  # next states (R, n)
    f: np.ndarray  # phi(s, a) (R, n, d)
    cell: np.ndarray  # s A + a (R, n)
    u_central: np.ndarray  # uniforms of the central next action (R, n)
    u_next: np.ndarray  # uniforms of the agents' next actions (R, n)
    counts: np.ndarray  # state visitation counts before this step's next states (R, n, S)


class SarsaCentral(NamedTuple):
    reward: np.ndarray  # pooled running mean reward per (s, a) (R, S*A)
    visits: np.ndarray  # pooled visits per (s, a) (R, S*A)


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
        self.p, self.r = perturbed(rng, base_p, base_r, runs, n, delta_env, delta_obj)
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
        self._rr, self._agents = np.arange(runs)[:, None], np.arange(n)

    def policy(self, theta: np.ndarray) -> np.ndarray:
        """Softmax policies (R, m, S, A) of parameters theta (R, m, d)."""
        return softmax(np.einsum("rsad,rmd->rmsa", self.phi, theta) / self.temp)

    def features(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        """phi(s, a) for index arrays (R, m), (R, m, d)."""
        return self.phi[self._rr, s, a]

    def act(self, theta: np.ndarray, s: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Actions (R, m) of the softmax policies of theta (R, m, d) at states s (R, m) from uniforms u (R, m)."""
        logits = np.einsum("rmad,rmd->rma", self.phi[self._rr, s], theta) / self.temp
        return categorical(np.cumsum(softmax(logits), -1), u)

    def td_direction(self, theta: np.ndarray, reward: np.ndarray, step: SarsaStep, u: np.ndarray) -> np.ndarray:
        """-(reward + gamma q_theta(s', a') - q_theta(s, a)) phi(s, a), a' drawn from theta's policy with uniforms u;
        theta (R, n, d) per agent."""
        a2 = self.act(theta, step.s2, u)
        delta = reward + self.gamma * (self.features(step.s2, a2) * theta).sum(-1) - (step.f * theta).sum(-1)
        return -(delta[..., None] * step.f)

    # the problem interface (problem.py)

    def draw(self, steps: int, rng: np.random.Generator) -> Trajectory:
        """A fresh trajectory: uniforms for every step and the uniformly drawn initial states."""
        u = rng.uniform(size=(steps + 1, self.runs, self.n, 4))
        uniform = np.broadcast_to(np.linspace(1 / self.states, 1, self.states), (self.runs, self.n, self.states))
        return Trajectory(u, categorical(uniform, u[-1, ..., 0]), np.ones((self.runs, self.n, self.states)))

    def sample(self, draws: Trajectory, t: int, models: np.ndarray) -> SarsaStep:
        """Step t of the trajectory, acting with the agents' current models."""
        if draws.pending is not None:
            draws.counts[self._rr, self._agents, draws.pending] += 1
            draws.states = draws.pending
        s, u = draws.states, draws.u[t]
        a = self.act(models, s, u[..., 0])
        s2 = categorical(self.cum_p[self._rr, self._agents, s, a], u[..., 1])
        draws.pending = s2
        return SarsaStep(s, a, self.r[self._rr, self._agents, s, a], s2, self.features(s, a), s * self.actions + a,
                         u[..., 2], u[..., 3], draws.counts)

    def grad(self, x: np.ndarray, batch: SarsaStep) -> np.ndarray:
        theta = x if x.ndim == 3 else np.broadcast_to(x[:, None], (self.runs, self.n, self.d))
        return self.td_direction(theta, batch.r, batch, batch.u_next)

    def error(self, models: np.ndarray) -> np.ndarray:
        return sq_err(models, self.theta_star)

    def central_start(self, central: str, weights: str) -> SarsaCentral:
        if central != "coe":
            raise ValueError("tabular MDPs: the central reward is learned by COE only")
        sa = self.states * self.actions
        return SarsaCentral(np.zeros((self.runs, sa)), np.full((self.runs, sa), 1e-9))

    def bias_correction(self, xc: np.ndarray, est: SarsaCentral, batch: SarsaStep) -> np.ndarray:
        """The central TD direction at each agent's (s, a), COE's reward including this step's (the scripts' order)."""
        reward = pooled_mean(est.reward, est.visits, batch.cell, batch.r)[0]
        theta = np.broadcast_to(xc[:, None], (self.runs, self.n, self.d))
        return self.td_direction(theta, np.take_along_axis(reward, batch.cell, axis=1), batch, batch.u_central)

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: SarsaCentral, batch: SarsaStep,
                             x: np.ndarray, weights: str) -> np.ndarray:
        if weights == "exact":
            rho = self.rho_true
        elif weights == "dre":
            dsa = (batch.counts / batch.counts.sum(-1, keepdims=True))[..., None] * self.policy(x)
            rho = dsa / (dsa.mean(1, keepdims=True) + 1e-9)
        else:
            raise ValueError(f"tabular MDPs: unknown density ratios {weights!r}")
        sa = self.states * self.actions
        w = np.take_along_axis(rho.reshape(self.runs, self.n, sa),
                               np.broadcast_to(batch.cell[:, None], (self.runs, self.n, self.n)), axis=2)
        return np.einsum("rij,rjd->rid", w, corr) / self.n

    def coe(self, est: SarsaCentral, batch: SarsaStep, a: np.ndarray) -> SarsaCentral:
        return SarsaCentral(*pooled_mean(est.reward, est.visits, batch.cell, batch.r))
