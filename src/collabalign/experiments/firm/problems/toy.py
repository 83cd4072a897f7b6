"""R3 of the FIRM reproduction (spec §8 R3): toy federated alignment with PPO, vectorised over arms, replicates and
clients (numpy, analytic gradients).

A tiny "LLM" (its world and reward models in `toy_world.py`, its sizes `ToySizes`, the spec's by default):
vocabulary V = 12, responses of L = 4 tokens drawn independently per position, P = 8 prompt types, frozen features
φ(x, l) ~ N(0, I/h) (h = 16) and base W_0 ~ N(0, 0.5²); logits z = W_0 φ + 2 B (A φ) with a LoRA analogue
A (r × h, r = 4, ~ N(0, 0.1²)) and B (V × r, zero at start). Only (A, B) are trained and averaged. Two reward models
in [0, 1] (sigmoids): helpfulness from token values help_tok ~ U(−1, 1), harmlessness from
harm_tok = 1.5 max(help_tok, 0) + U(−0.3, 0.3) scaled by the prompt's risk linspace(0, 1, P) (helpful tokens tend to be
unsafe); the "correlated" world mixes in a shared quality qual ~ U(−1, 1) with c = 0.9. Heterogeneous RMs: clients
c >= C/2 score helpfulness with help_alt = 0.8 help_tok + 0.6 U(−1, 1).

PPO per client: K rollout batches of B per round, ppo_epochs over minibatches, clip 0.2; sequence reward per objective
r_j − β_KL KL_seq(π_old ‖ π_ref); a per-client, per-prompt-type, per-objective EMA baseline (rate 0.1); advantages
whitened per objective; every token's ratio uses its sequence advantage; losses normalised by (minibatch · L); the
M per-objective gradients are analytic (∂log π_y/∂z = e_y − π) and their λ-combination goes into the client's
persistent Adam. The held-out reward of the global model is exact (all V^L responses of every prompt type)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from collabalign.data.partition import dirichlet, iid
from collabalign.experiments.firm.problems.toy_world import M, World, expectation_subscripts, response_rewards, rewards
from collabalign.methods.firm.rules import Rule, disagreement, dispersion, server_weights
from collabalign.methods.firm.solver import gram, normalise, penalty, qp

SCALE = 2.0  # the LoRA analogue's scale: z = W_0 φ + SCALE · B (A φ)


@dataclass(frozen=True)
class Arm:
    """One configuration: the λ rule, the reward world, heterogeneous helpfulness RMs and the prompt split."""

    name: str
    rule: Rule
    correlated: bool = False
    hetero: bool = False
    split: str = "iid"  # iid | dirichlet

    def __post_init__(self) -> None:
        if self.split not in ("iid", "dirichlet"):
            raise ValueError(f"{self.name}: split must be iid or dirichlet, got {self.split!r}")
        if self.rule.kind == "fmol":
            raise ValueError(f"{self.name}: FMOL is a synthetic-problem reference only (R1)")


@dataclass(frozen=True)
class Setting:
    """The paper's federated numbers (spec §8 R3) by default; one batch of arms shares them."""

    clients: int = 8
    rounds: int = 16
    local_batches: int = 3
    batch: int = 16
    minibatch: int = 8
    epochs: int = 3
    clip: float = 0.2
    lr: float = 0.03
    kl: str = "adaptive"  # adaptive (TRL's controller) | fixed
    kl_coef: float = 0.2
    kl_target: float = 0.03
    kl_horizon: float = 10_000.0
    baseline_rate: float = 0.1
    dirichlet_alpha: float = 0.3
    prompts_per_type: int = 32  # the prompt pool split across clients

    def __post_init__(self) -> None:
        if self.kl not in ("adaptive", "fixed"):
            raise ValueError(f"kl must be 'adaptive' or 'fixed', got {self.kl!r}")
        if not 0 < self.minibatch <= self.batch:
            raise ValueError(f"minibatch must be in [1, batch = {self.batch}], got {self.minibatch}")


def prompt_mix(arms: list[Arm], setting: Setting, world: World, rng: np.random.Generator) -> np.ndarray:
    """Each client's prompt-type distribution (A, R, C, P) from an iid or Dirichlet split of a pool of
    prompts_per_type prompts of every type (collabalign.data.partition)."""
    P = world.sizes.prompts
    labels = np.repeat(np.arange(P), setting.prompts_per_type)
    out = np.zeros((len(arms), world.replicates, setting.clients, P))
    for (a, arm), r in itertools.product(enumerate(arms), range(world.replicates)):  # data setup, not a hot path
        parts = (dirichlet(labels, setting.clients, setting.dirichlet_alpha, rng) if arm.split == "dirichlet"
                 else iid(len(labels), setting.clients, rng))
        for c, part in enumerate(parts):
            out[a, r, c] = np.bincount(labels[part], minlength=P) / len(part)
    return out


class Toy:
    """Arms × replicates × clients of the toy, flattened to N = A R C clients; `run` trains them all."""

    def __init__(self, world: World, arms: list[Arm], setting: Setting, rng: np.random.Generator):
        self.world, self.arms, self.setting, self.rng, self.sizes = world, arms, setting, rng, world.sizes
        A, R, C = len(arms), world.replicates, setting.clients
        V, P, r, h = world.sizes.vocab, world.sizes.prompts, world.sizes.rank, world.sizes.hidden
        self.shape = (A, R, C)
        n = A * R * C
        self.rep = np.tile(np.repeat(np.arange(R), C), A)
        arm_of = np.repeat(np.arange(A), R * C)
        client = np.tile(np.arange(C), A * R)
        self.correlated = np.array([arm.correlated for arm in arms])[arm_of]
        alt = np.array([arm.hetero for arm in arms])[arm_of] & (client >= C // 2)
        self.help = np.where(alt[:, None], world.help_alt[self.rep], world.help[self.rep])
        self.phi, self.w0 = world.phi[self.rep], world.w0[self.rep]
        self.base = np.einsum("nvh,nplh->nplv", self.w0, self.phi)  # reference logits (N, P, L, V)
        self.cum_q = np.cumsum(prompt_mix(arms, setting, world, rng).reshape(n, P), -1)
        self.kinds = np.array([arm.rule.kind for arm in arms])[arm_of]
        self.penalty = np.stack([penalty(M, arm.rule.beta, arm.rule.p) for arm in arms])[arm_of]  # (N, M)
        self.normalize = np.array([arm.rule.normalize for arm in arms])[arm_of]
        self.fixed = np.stack([arm.rule.fixed(M) for arm in arms])[arm_of]
        d = r * h + V * r
        self.theta = np.concatenate([world.a0[self.rep].reshape(n, -1), np.zeros((n, V * r))], 1)
        self.adam_m, self.adam_v, self.adam_t = np.zeros((n, d)), np.zeros((n, d)), 0
        self.kl_coef = np.full(n, setting.kl_coef)
        self.baseline, self.seen = np.zeros((n, P, M)), np.zeros((n, P), bool)
        self.n, self.d = n, d

    def _factors(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r, h = self.sizes.rank, self.sizes.hidden
        return theta[:, : r * h].reshape(-1, r, h), theta[:, r * h:].reshape(-1, self.sizes.vocab, r)

    def _logits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Logits (N, b L, V) of prompts x (N, b) under the current adapters, with the features f (N, b L, h) and
        A f (N, b L, r); positions are flattened into the sample axis."""
        la, lb = self._factors(self.theta)
        rows = np.arange(self.n)[:, None]
        f = self.phi[rows, x].reshape(self.n, -1, self.sizes.hidden)
        u = f @ np.swapaxes(la, 1, 2)
        return self.base[rows, x].reshape(self.n, -1, self.sizes.vocab) + SCALE * (u @ np.swapaxes(lb, 1, 2)), f, u

    def rollout(self) -> dict[str, np.ndarray]:
        """B prompts per client from its mix, responses from the current policy, rewards, KL and advantages."""
        s, (V, L, P) = self.setting, (self.sizes.vocab, self.sizes.length, self.sizes.prompts)
        rows = np.arange(self.n)[:, None]
        x = np.minimum((self.rng.random((self.n, s.batch))[..., None] > self.cum_q[:, None]).sum(-1), P - 1)
        z, _, _ = self._logits(x)
        logp = log_softmax(z).reshape(self.n, s.batch, L, V)
        cum = np.cumsum(np.exp(logp), -1)
        y = np.minimum((self.rng.random((self.n, s.batch, L))[..., None] > cum).sum(-1), V - 1)
        logp_old = np.take_along_axis(logp, y[..., None], -1)[..., 0]
        logp_ref = np.take_along_axis(log_softmax(self.base[rows, x]), y[..., None], -1)[..., 0]
        kl = (logp_old - logp_ref).sum(-1)  # (N, B)
        sums = [token_sum(table, y) for table in (self.help, self.world.harm[self.rep], self.world.qual[self.rep])]
        r = rewards(*sums, self.world.risk[x], self.correlated[:, None])
        shaped = r - self.kl_coef[:, None, None] * kl[..., None]
        onehot = np.eye(P)[x]  # (N, B, P)
        adv = shaped - np.einsum("nbp,npm->nbm", onehot, self.baseline)
        adv = (adv - adv.mean(1, keepdims=True)) / (adv.std(1, keepdims=True) + 1e-8)
        return {"x": x, "y": y, "logp_old": logp_old, "adv": adv, "rewards": r, "kl": kl, "shaped": shaped,
                "onehot": onehot}

    def update_baseline(self, batch: dict[str, np.ndarray]) -> None:
        """EMA (rate baseline_rate) of the shaped reward per prompt type and objective; first visit sets it."""
        counts = batch["onehot"].sum(1)
        means = np.einsum("nbp,nbm->npm", batch["onehot"], batch["shaped"]) / np.maximum(counts, 1)[..., None]
        rate = np.where(self.seen, self.setting.baseline_rate, 1.0)[..., None]
        self.baseline = np.where(counts[..., None] > 0, self.baseline + rate * (means - self.baseline), self.baseline)
        self.seen |= counts > 0

    def gradients(self, batch: dict[str, np.ndarray], idx: np.ndarray, clipped: bool = True) -> np.ndarray:
        """Per-objective gradients (N, d, M) of the clipped PPO losses on minibatch idx (N, mb) of `batch`."""
        rows = np.arange(self.n)[:, None]
        x, y = batch["x"][rows, idx], batch["y"][rows, idx].reshape(self.n, -1)  # y: (N, mb L)
        z, f, u = self._logits(x)
        pi = np.exp(log_softmax(z))
        ratio = np.exp(np.log(np.take_along_axis(pi, y[..., None], -1)[..., 0])
                       - batch["logp_old"][rows, idx].reshape(self.n, -1))
        adv = np.repeat(batch["adv"][rows, idx], self.sizes.length, 1)  # each token carries its sequence's advantage
        eps = self.setting.clip
        active = ~(((adv > 0) & (ratio[..., None] > 1 + eps)) | ((adv < 0) & (ratio[..., None] < 1 - eps)))
        if not clipped:
            active = np.ones_like(active)
        coef = -adv * ratio[..., None] * active / y.shape[1]  # dL^j/dlog π per token (N, mb L, M)
        e = np.eye(self.sizes.vocab)[y] - pi  # dlog π_y/dz (N, mb L, V)
        _, lb = self._factors(self.theta)
        k, r = y.shape[1], self.sizes.rank
        g_b = SCALE * np.swapaxes(e, 1, 2) @ (u[..., None] * coef[:, :, None, :]).reshape(self.n, k, r * M)
        t = (e @ lb)[..., None] * coef[:, :, None, :]  # (N, mb L, r, M)
        g_a = SCALE * np.swapaxes(t.reshape(self.n, k, r * M), 1, 2) @ f  # (N, r M, h)
        g_a = np.swapaxes(g_a.reshape(self.n, r, M, self.sizes.hidden), 2, 3)
        return np.concatenate([g_a.reshape(self.n, -1, M), g_b.reshape(self.n, -1, M)], 1)

    def firm_weights(self, g: np.ndarray) -> np.ndarray:
        """Every client's regularised MGDA weights with its arm's penalty (β/2 or 1/p) and normalisation."""
        G = gram(g)
        G = np.where(self.normalize[:, None, None], normalise(G), G)
        return qp(G + self.penalty[:, :, None] * np.eye(M))

    def server_round(self) -> np.ndarray:
        """FedCMOO-A: a separate batch at θ_t, per-objective gradients (ratio 1) averaged per arm and replicate,
        one β = 0 MGDA -> λ_t per client (N, M). Computed for every arm of the batch when one of them needs it;
        only the FedCMOO-A arms use it."""
        batch = self.rollout()
        g = self.gradients(batch, np.broadcast_to(np.arange(self.setting.batch), (self.n, self.setting.batch)), False)
        lam = server_weights(g.reshape(*self.shape, self.d, M))
        return np.repeat(lam.reshape(-1, M), self.setting.clients, 0)

    def adam(self, grad: np.ndarray, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        self.adam_t += 1
        self.adam_m = b1 * self.adam_m + (1 - b1) * grad
        self.adam_v = b2 * self.adam_v + (1 - b2) * grad**2
        m_hat, v_hat = self.adam_m / (1 - b1**self.adam_t), self.adam_v / (1 - b2**self.adam_t)
        self.theta = self.theta - lr * m_hat / (np.sqrt(v_hat) + eps)

    def run(self, eval_rewards: np.ndarray) -> dict[str, np.ndarray]:
        """All rounds. Returns per optimiser step: λ (steps, A, R, C, M), D_λ and T^disagr (steps, A, R); per batch:
        client-mean training rewards (batches, A, R, M) and KL (batches, A, R); per round: the exact held-out
        rewards of the global model (T + 1, A, R, M), round 0 being the start."""
        s, (A, R, C) = self.setting, self.shape
        lam_log, disp, drift, train, kl_log = [], [], [], [], []
        held_out = [self.evaluate(eval_rewards)]
        for _ in range(s.rounds):
            lam_round = self.server_round() if (self.kinds == "fedcmoo").any() else None
            for _ in range(s.local_batches):
                batch = self.rollout()
                for _ in range(s.epochs):
                    order = np.argsort(self.rng.random((self.n, s.batch)), 1)
                    for start in range(0, s.batch, s.minibatch):
                        g = self.gradients(batch, order[:, start:start + s.minibatch])
                        lam = np.where((self.kinds == "firm")[:, None], self.firm_weights(g), self.fixed)
                        if lam_round is not None:
                            lam = np.where((self.kinds == "fedcmoo")[:, None], lam_round, lam)
                        self.adam(np.einsum("ndm,nm->nd", g, lam), s.lr)
                        lam_log.append(lam.reshape(A, R, C, M))
                        disp.append(dispersion(lam_log[-1]))
                        drift.append(disagreement(g.reshape(A, R, C, self.d, M), lam_log[-1]))
                self.update_baseline(batch)
                self.update_kl(batch["kl"].mean(1))
                train.append(batch["rewards"].mean(1).reshape(A, R, C, M).mean(2))
                kl_log.append(batch["kl"].mean(1).reshape(A, R, C).mean(2))
            self.theta = np.repeat(self.theta.reshape(A * R, C, self.d).mean(1), C, 0)  # FedAvg per arm, replicate
            held_out.append(self.evaluate(eval_rewards))
        return {"lambda": np.stack(lam_log), "dispersion": np.stack(disp), "disagreement": np.stack(drift),
                "train_rewards": np.stack(train), "kl": np.stack(kl_log), "held_out": np.stack(held_out)}

    def update_kl(self, kl: np.ndarray) -> None:
        """TRL's adaptive controller per client: β_KL ← β_KL (1 + clip(KL / target − 1, ±0.2) B / horizon)."""
        if self.setting.kl == "adaptive":
            err = np.clip(kl / self.setting.kl_target - 1, -0.2, 0.2)
            self.kl_coef = self.kl_coef * (1 + err * self.setting.batch / self.setting.kl_horizon)

    def evaluate(self, eval_rewards: np.ndarray) -> np.ndarray:
        """Exact expected (help, harm) of each arm's global model (client 0's copy after FedAvg), prompts uniform:
        (A, R, M). `eval_rewards` (2 worlds, R, P, V, …, V, M) from `response_rewards`; the expectation over the
        V^L responses is a contraction with the L per-position distributions, one call per (world, replicate)."""
        A, R, C = self.shape
        first = np.arange(0, self.n, C)
        la, lb = self._factors(self.theta[first])
        u = np.einsum("nrh,nplh->nplr", la, self.phi[first])
        probs = np.exp(log_softmax(self.base[first] + SCALE * np.einsum("nvr,nplr->nplv", lb, u)))  # (AR, P, L, V)
        kind, rep = self.correlated[first].astype(int), self.rep[first]
        out = np.zeros((A * R, M))
        contraction = expectation_subscripts(self.sizes.length)
        for k, r in {(int(k), int(r)) for k, r in zip(kind, rep, strict=True)}:  # <= 2 R groups of models
            sel = (kind == k) & (rep == r)
            p = [probs[sel, :, pos] for pos in range(self.sizes.length)]
            out[sel] = np.einsum(contraction, eval_rewards[k, r], *p, optimize=True) / self.sizes.prompts
        return out.reshape(A, R, M)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def token_sum(table: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Σ_l table[n, y_l] for per-client token values (N, V) and responses (N, B, L) -> (N, B)."""
    return np.take_along_axis(table, y.reshape(len(y), -1), 1).reshape(y.shape).sum(-1)


def simulate(world: World, arms: list[Arm], setting: Setting, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Trains every arm on every replicate world at once (see `Toy.run`)."""
    return Toy(world, arms, setting, rng).run(response_rewards(world))
