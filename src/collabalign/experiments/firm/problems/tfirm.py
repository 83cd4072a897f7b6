"""T-FIRM (spec §3.3, Algorithm 2) with the projected Markovian mini-batch TD(0) critic (§3.4, Algorithm 3) on the
tabular multi-objective MDP of spec §8 R2, vectorised over replicates, variants (β, η, normalisation) and clients.

MOMDP: n_S = 6, n_A = 3, γ = 0.9, P(·|s, a) ~ Dirichlet(0.5), R_1 ~ U(0, 1), R_2 = clip(1 − R_1 + U(−0.3, 0.3), 0, 1)
(conflicting), ρ uniform; tabular softmax policy θ (S, A); one-hot critic features (‖φ‖ = 1). Exact evaluation:
V^j = (I − γP_π)⁻¹ r^j_π, J_j = ρᵀV^j, ∂J_j/∂θ_{s,a} = d(s) π(a|s) A^j(s, a) / (1 − γ), d = (1 − γ) ρᵀ(I − γP_π)⁻¹.
Sampling uses the restart kernel γP + (1 − γ)ρ, whose stationary law is d, so E[δψ] = (1 − γ)∇J; the TD target
uses s' ~ P. Updates ascend J (spec §9 item 7)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collabalign.methods.firm.rules import dispersion, stationarity
from collabalign.methods.firm.solver import gram, normalise, qp

C_PSI = np.sqrt(2.0)  # ‖ψ‖ <= √2 for a tabular softmax


class MOMDP:
    """`replicates` independent tabular MOMDPs: P (R, S, A, S), rewards r (R, S, A, M) in [0, 1], ρ (S,)."""

    def __init__(self, rng: np.random.Generator, replicates: int, states: int = 6, actions: int = 3,
                 gamma: float = 0.9, concentration: float = 0.5):
        self.P = rng.dirichlet(np.full(states, concentration), size=(replicates, states, actions))
        r1 = rng.uniform(size=(replicates, states, actions))
        r2 = np.clip(1 - r1 + rng.uniform(-0.3, 0.3, size=r1.shape), 0, 1)
        self.r = np.stack([r1, r2], -1)
        self.rho = np.full(states, 1.0 / states)
        self.replicates, self.states, self.actions, self.gamma = replicates, states, actions, gamma
        self.r_max = 1.0

    def _env(self, batch_dims: int) -> tuple[np.ndarray, np.ndarray]:
        """P and r shaped to broadcast against θ (R, *batch, S, A)."""
        shape = (self.replicates, *([1] * batch_dims))
        return self.P.reshape(*shape, *self.P.shape[1:]), self.r.reshape(*shape, *self.r.shape[1:])

    def evaluate(self, theta: np.ndarray) -> dict[str, np.ndarray]:
        """Exact V (…, S, M), J (…, M), ∇J (…, S, A, M) and the discounted visitation d (…, S) at θ (R, …, S, A)."""
        P, r = self._env(theta.ndim - 3)
        pi = softmax(theta)
        A_pi = np.eye(self.states) - self.gamma * np.einsum("...sa,...sat->...st", pi, P)
        V = np.linalg.solve(A_pi, np.einsum("...sa,...sam->...sm", pi, r))
        Q = r + self.gamma * np.einsum("...sat,...tm->...sam", P, V)
        rho = np.broadcast_to(self.rho, V.shape[:-1])[..., None]
        d = (1 - self.gamma) * np.linalg.solve(np.swapaxes(A_pi, -1, -2), rho)[..., 0]
        grad = d[..., None, None] * pi[..., None] * (Q - V[..., None, :]) / (1 - self.gamma)
        return {"V": V, "J": np.einsum("s,...sm->...m", self.rho, V), "grad": grad, "d": d}

    def sample(self, theta: np.ndarray, s: np.ndarray, n: int, rng: np.random.Generator):
        """n transitions of the restart chain for every chain (R, X) with policies θ (R, X, S, A) from states s
        (R, X): states, actions, TD next states s' ~ P, rewards (n, R, X, M), and the chain's last state."""
        R, X = s.shape
        S, A = self.states, self.actions
        joint = np.cumsum((softmax(theta)[..., None] * self.P[:, None]).reshape(R, X, S, A * S), -1)
        ri, xi = np.arange(R)[:, None], np.arange(X)[None, :]
        u = rng.random((n, 3, R, X))
        out = np.zeros((3, n, R, X), np.int64)
        for k in range(n):
            idx = np.minimum((joint[ri, xi, s] < u[k, 0, ..., None]).sum(-1), A * S - 1)
            a, s_next = np.divmod(idx, S)
            out[:, k] = s, a, s_next
            s = np.where(u[k, 1] < self.gamma, s_next, (u[k, 2] * S).astype(np.int64))
        states, actions, nexts = out
        return states, actions, nexts, self.r[ri, states, actions], s


def softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


@dataclass(frozen=True)
class Critic:
    """Algorithm 3: N mini-batches of D Markovian transitions, step α', projection radius R_w."""

    iterations: int = 5
    batch: int = 16
    step: float = 0.5
    radius: float = 40.0


def _values_at(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """φ(s)ᵀw for one-hot φ: w (R, X, S, M) at states s (n, R, X) -> (n, R, X, M)."""
    R, X = s.shape[1:]
    return w[np.arange(R)[:, None], np.arange(X)[None, :], s]


def td_errors(env: MOMDP, w: np.ndarray, s, s_next, r) -> np.ndarray:
    """δ^j = r^j + γ φ(s')ᵀw^j − φ(s)ᵀw^j for transitions (n, R, X) and critics w (R, X, S, M)."""
    return r + env.gamma * _values_at(w, s_next) - _values_at(w, s)


def critic(env: MOMDP, theta: np.ndarray, w: np.ndarray, s: np.ndarray, cfg: Critic, rng: np.random.Generator,
           trace: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3 for every chain (warm start w (R, X, S, M), chain state s (R, X)): returns w_N and the state.
    `trace` (optional) collects w after every mini-batch."""
    onehot = np.eye(env.states)
    for _ in range(cfg.iterations):
        states, _, nexts, r, s = env.sample(theta, s, cfg.batch, rng)
        delta = td_errors(env, w, states, nexts, r)
        w = w + cfg.step / cfg.batch * np.einsum("nrxs,nrxm->rxsm", onehot[states], delta)
        norm = np.linalg.norm(w, axis=-2, keepdims=True)
        w = w * np.minimum(1.0, cfg.radius / np.maximum(norm, 1e-300))
        if trace is not None:
            trace.append(w)
    return w, s


def actor_gradients(env: MOMDP, theta: np.ndarray, w: np.ndarray, s: np.ndarray, batch: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 10: g^j = (1/B) Σ_l δ^j_l ψ(a_l|s_l) on B Markovian transitions -> (R, X, S, A, M) and the chain state."""
    states, actions, nexts, r, s = env.sample(theta, s, batch, rng)
    delta = td_errors(env, w, states, nexts, r)
    pi_s = softmax(theta)[np.arange(s.shape[0])[:, None], np.arange(s.shape[1])[None, :], states]  # (B, R, X, A)
    score = np.eye(env.actions)[actions] - pi_s
    g = np.einsum("nrxs,nrxa,nrxm->rxsam", np.eye(env.states)[states], score, delta) / batch
    return g, s


@dataclass(frozen=True)
class Variant:
    """One T-FIRM configuration run side by side with others: β, smoothing η ("1/t" or a constant in (0, 1]; 1 is
    no smoothing) and trace normalisation (off in the theory)."""

    beta: float = 0.01
    eta: str | float = "1/t"
    normalize: bool = False

    @property
    def label(self) -> str:
        eta = "1/t" if self.eta == "1/t" else f"{float(self.eta):g}"
        return f"beta={self.beta:g} eta={eta}" + (" norm" if self.normalize else "")


@dataclass(frozen=True)
class Setting:
    """Clients C, rounds T, local steps K, actor batch B, actor step α and the critic (spec §8 R2)."""

    clients: int = 8
    rounds: int = 100
    local_steps: int = 5
    batch: int = 32
    alpha: float = 0.5
    critic: Critic = Critic()


def simulate(env: MOMDP, variants: list[Variant], setting: Setting, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Algorithm 2 for every replicate, variant and client at once (λ_0 uniform, w_0 = 0, s_0 ~ ρ, θ_0 = 0).
    Per round (T, R, V), at the synchronised model θ̄: min_λ ‖∇J λ‖², ‖∇J λ̄‖² (λ̄ the client mean), its running
    average, D_λ (mean over the round's steps), the critic error ‖w − V^π(θ^c)‖² (mean over clients and objectives)
    and J (T, R, V, M). Lemma 7 (‖g^{j,c}‖ <= C_ψ (r_max + (1 + γ) R_w)) and Lemma 10 (‖λ_t − λ_{t+1}‖₁ <= 2η_{t+1})
    are checked at every step: their worst ratios (R, V) and whether they held everywhere."""
    R, V, C, S, A, M = env.replicates, len(variants), setting.clients, env.states, env.actions, 2
    T, K = setting.rounds, setting.local_steps
    theta = np.zeros((R, V * C, S, A))
    w = np.zeros((R, V * C, S, M))
    s = (rng.random((R, V * C)) * S).astype(np.int64)
    lam = np.full((R, V * C, M), 1.0 / M)
    beta = np.repeat([v.beta for v in variants], C)[None, :, None]
    norm = np.repeat([v.normalize for v in variants], C)[None, :, None, None]
    harmonic = np.repeat([v.eta == "1/t" for v in variants], C)[None, :, None]
    const_eta = np.repeat([1.0 if v.eta == "1/t" else float(v.eta) for v in variants], C)[None, :, None]
    bound7 = C_PSI * (env.r_max + (1 + env.gamma) * setting.critic.radius)
    out = {k: np.zeros((T, R, V)) for k in ("stationarity", "stationarity_lambda_bar", "running_average",
                                             "dispersion", "critic_error")}
    out["J"], out["lambda_bar"] = np.zeros((T, R, V, M)), np.zeros((T, R, V, M))
    worst7, worst10 = np.zeros((R, V)), np.zeros((R, V))
    for t in range(1, T * K + 1):
        w, s = critic(env, theta, w, s, setting.critic, rng)
        g, s = actor_gradients(env, theta, w, s, setting.batch, rng)
        flat = g.reshape(R, V * C, S * A, M)
        G = gram(flat)
        star = qp(np.where(norm, normalise(G), G) + beta[..., None] / 2 * np.eye(M))
        eta = np.where(harmonic, 1.0 / t, const_eta)
        new = (1 - eta) * lam + eta * star
        ratio10 = np.abs(new - lam).sum(-1) / (2 * eta[..., 0])
        worst10 = np.maximum(worst10, ratio10.reshape(R, V, C).max(-1))
        worst7 = np.maximum(worst7, (np.linalg.norm(flat, axis=-2) / bound7).reshape(R, V, C, M).max((-1, -2)))
        lam = new
        theta = theta + setting.alpha * np.einsum("rxsam,rxm->rxsa", g, lam)
        rnd = (t - 1) // K
        out["dispersion"][rnd] += dispersion(lam.reshape(R, V, C, M)) / K
        if t % K == 0:
            local = theta.reshape(R, V, C, S, A)
            exact_local = env.evaluate(local)
            out["critic_error"][rnd] = ((w.reshape(R, V, C, S, M) - exact_local["V"]) ** 2).sum(-2).mean((-1, -2))
            theta = np.repeat(local.mean(2), C, 1)
            exact = env.evaluate(theta.reshape(R, V, C, S, A)[:, :, 0])
            grads = exact["grad"].reshape(R, V, S * A, M)
            lam_bar = lam.reshape(R, V, C, M).mean(2)
            out["stationarity"][rnd] = stationarity(grads)
            out["stationarity_lambda_bar"][rnd] = stationarity(grads, lam_bar)
            out["J"][rnd], out["lambda_bar"][rnd] = exact["J"], lam_bar
    out["running_average"] = np.cumsum(out["stationarity_lambda_bar"], 0) / np.arange(1, T + 1)[:, None, None]
    out.update(lemma7_worst=worst7, lemma7_holds=worst7 <= 1 + 1e-12, lemma10_worst=worst10,
               lemma10_holds=worst10 <= 1 + 1e-12)
    return out


def critic_errors(env: MOMDP, theta: np.ndarray, cfg: Critic, rng: np.random.Generator) -> np.ndarray:
    """Lemma 3 on a fixed policy θ (R, S, A): ‖w_k − V^π‖² (summed over objectives) after each of cfg.iterations
    mini-batches from w_0 = 0 (k = 0 included) -> (N + 1, R)."""
    target = env.evaluate(theta)["V"]
    w = np.zeros((env.replicates, 1, env.states, 2))
    s = (rng.random((env.replicates, 1)) * env.states).astype(np.int64)
    trace = [w]
    critic(env, theta[:, None], w, s, cfg, rng, trace)
    return np.stack([((x[:, 0] - target) ** 2).sum((-1, -2)) for x in trace])
