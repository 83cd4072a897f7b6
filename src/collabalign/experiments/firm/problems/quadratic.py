"""R1 of the FIRM reproduction (spec §8 R1): the synthetic federated quadratic with a known Pareto set, and one
vectorised simulation of FIRM and its baselines over replicates (seeds) and clients at once.

f_j(θ) = ½ (θ − a_j)ᵀ H_j (θ − a_j) is minimised (gradient descent); d = 20, H_j = diag(h), h = linspace(1, 4, d),
H_1[1, 1] = 1.5 h[1] (0-based indices; H_j[0, 0] = h[0] = 1 already), a_1 = +0.5 e_0, a_2 = −0.5 e_0 and for M = 3
a_3 = 0.5 e_1. The start θ_0 = (0, 5, …, 5) lies far along a shared valley, where the gradients are nearly collinear.
The stochastic oracle adds (σ/√B)(√ρ_n ξ_0 + √(1 − ρ_n) ξ_j) with ξ ~ N(0, I_d) fresh per call (shared-sample
correlation ρ_n). Heterogeneous clients (non-IID analogue): a^c_j = a_j + N(0, hetero² I)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collabalign.methods.firm.rules import Rule, Traffic, disagreement, dispersion, server_weights, stationarity


@dataclass(frozen=True)
class Setting:
    """Rounds T, local steps K, step α, batch B, noise σ and its shared-sample correlation ρ_n (spec §8 R1)."""

    rounds: int = 40
    local_steps: int = 5
    alpha: float = 0.02
    batch: int = 16
    sigma: float = 2.0
    rho_noise: float = 0.5


class Quadratic:
    """`replicates` × `clients` copies of the M-objective quadratic; targets a (S, C, M, d), curvatures h (M, d)."""

    def __init__(self, replicates: int, clients: int = 8, objectives: int = 2, d: int = 20, start: str = "valley",
                 hetero: float = 0.0, rng: np.random.Generator | None = None):
        if objectives not in (2, 3):
            raise ValueError(f"the R1 quadratic has M = 2 or 3 objectives, got {objectives}")
        if start not in ("valley", "conflict"):
            raise ValueError(f"start must be 'valley' (θ0 = (0, 5, …, 5)) or 'conflict' (θ0 = 0), got {start!r}")
        base = np.linspace(1.0, 4.0, d)
        self.h = np.tile(base, (objectives, 1))
        self.h[:, 0] = 1.0
        self.h[0, 1] = 1.5 * base[1]
        a = np.zeros((objectives, d))
        a[0, 0], a[1, 0] = 0.5, -0.5
        if objectives == 3:
            a[2, 1] = 0.5
        self.a = np.broadcast_to(a, (replicates, clients, objectives, d)).copy()
        if hetero > 0:
            self.a += hetero * (rng or np.random.default_rng(0)).standard_normal(self.a.shape)
        self.a_bar = self.a.mean(1)  # (S, M, d): the global objective's targets
        self.theta0 = np.zeros(d) if start == "conflict" else np.r_[0.0, np.full(d - 1, 5.0)]
        self.replicates, self.clients, self.objectives, self.d = replicates, clients, objectives, d

    def grads(self, theta: np.ndarray) -> np.ndarray:
        """Exact client gradients (S, C, d, M) at client models θ (S, C, d)."""
        return np.swapaxes(self.h * (theta[:, :, None, :] - self.a), -1, -2)

    def global_grads(self, theta: np.ndarray) -> np.ndarray:
        """Exact gradients (S, d, M) of the global objective J = (1/C) Σ_c f^c at θ (S, d)."""
        return np.swapaxes(self.h * (theta[:, None, :] - self.a_bar), -1, -2)

    def values(self, theta: np.ndarray) -> np.ndarray:
        """Global objective values (S, ..., M) at θ (S, ..., d)."""
        diff = theta[:, None, ..., None, :] - self.a.reshape(self.replicates, self.clients,
                                                             *([1] * (theta.ndim - 2)), self.objectives, self.d)
        return 0.5 * (self.h * diff**2).sum(-1).mean(1)

    def pareto_set(self, w: np.ndarray) -> np.ndarray:
        """θ*(w) = (Σ_j w_j H_j)⁻¹ Σ_j w_j H_j ā_j for weights w (n, M): (S, n, d)."""
        num = np.einsum("nm,md,smd->snd", w, self.h, self.a_bar)
        return num / (w @ self.h)

    def front(self, points: int = 201) -> np.ndarray:
        """The exact Pareto front (S, points, M); M = 2: w_1 on a grid of [0, 1], M = 3: a grid of the simplex."""
        if self.objectives == 2:
            w1 = np.linspace(0, 1, points)
            w = np.stack([w1, 1 - w1], 1)
        else:
            n = int(np.sqrt(2 * points))
            g = np.array([(i, j, n - i - j) for i in range(n + 1) for j in range(n + 1 - i)], float) / n
            w = g
        return self.values(self.pareto_set(w))

    def noisy(self, theta: np.ndarray, setting: Setting, rng: np.random.Generator) -> np.ndarray:
        """The stochastic oracle: client gradients (S, C, d, M) with shared-sample correlated noise."""
        shape = (*theta.shape, self.objectives)
        shared = rng.standard_normal((*theta.shape, 1))
        own = rng.standard_normal(shape)
        scale = setting.sigma / np.sqrt(setting.batch)
        noise = np.sqrt(setting.rho_noise) * shared + np.sqrt(1 - setting.rho_noise) * own
        return self.grads(theta) + scale * noise


def simulate(problem: Quadratic, rule: Rule, setting: Setting, rng: np.random.Generator,
             traffic: Traffic | None = None) -> dict[str, np.ndarray]:
    """T rounds of K local steps for every replicate and client at once. Per round (T, S): Pareto stationarity of the
    global model min_λ ‖∇J λ‖², ‖∇J λ̄‖² at the round's mean client-average λ̄, D_λ and T^disagr (means over the
    round's steps), λ volatility, model dispersion, objective values f (T, S, M); the λ trace (T K, S, C, M).
    `traffic` (replicate 0) gets every message: the model down and up, FedCMOO-A's gradients and λ, FMOL's per step."""
    S, C, M = problem.replicates, problem.clients, problem.objectives
    T, K = setting.rounds, setting.local_steps
    theta = np.broadcast_to(problem.theta0, (S, problem.d)).copy()
    out = {k: np.zeros((T, S)) for k in ("stationarity", "stationarity_lambda_bar", "dispersion", "disagreement",
                                         "volatility", "model_dispersion")}
    out["values"], out["lambda"] = np.zeros((T, S, M)), np.zeros((T * K, S, C, M))
    fixed = np.broadcast_to(rule.fixed(M), (S, C, M)) if rule.kind == "ls" else None
    prev = None
    for t in range(T):
        local = np.repeat(theta[:, None], C, 1)
        if traffic:
            traffic.send(t + 1, C, "down", shared={"theta": theta[0]})
        if rule.kind == "fedcmoo":  # a separate batch at θ_t; the server's λ is fixed for the round
            g0 = problem.noisy(local, setting, rng)
            lam_round = np.repeat(server_weights(g0)[:, None], C, 1)
            if traffic:
                traffic.send(t + 1, C, "up", own={"grads": g0[0]})
                traffic.send(t + 1, C, "down", shared={"lambda": lam_round[0, 0]})
        lam_sum, vol_n = np.zeros((S, M)), 0
        for k in range(K):
            g = problem.noisy(local, setting, rng)
            if rule.kind == "firm":
                lam = rule.local(g)
            elif rule.kind == "fmol":
                lam = np.repeat(server_weights(g)[:, None], C, 1)
                if traffic:
                    traffic.send(t + 1, C, "up", own={"grads": g[0]})
                    traffic.send(t + 1, C, "down", shared={"lambda": lam[0, 0]})
            else:
                lam = lam_round if rule.kind == "fedcmoo" else fixed
            local = local - setting.alpha * np.einsum("scdm,scm->scd", g, lam)
            out["dispersion"][t] += dispersion(lam) / K
            out["disagreement"][t] += disagreement(g, lam) / K
            if prev is not None:
                out["volatility"][t] += np.abs(lam[..., 0] - prev[..., 0]).mean(-1)
                vol_n += 1
            prev = lam
            lam_sum += lam.mean(1)
            out["lambda"][t * K + k] = lam
        out["volatility"][t] /= max(vol_n, 1)
        if traffic:
            traffic.send(t + 1, C, "up", own={"theta": local[0]})
        theta = local.mean(1)
        out["model_dispersion"][t] = ((local - theta[:, None]) ** 2).sum(-1).mean(-1)
        exact = problem.global_grads(theta)
        out["stationarity"][t] = stationarity(exact)
        out["stationarity_lambda_bar"][t] = stationarity(exact, lam_sum / K)
        out["values"][t] = problem.values(theta)
    return out
