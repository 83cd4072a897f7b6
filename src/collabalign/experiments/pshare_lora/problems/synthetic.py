"""The §8.1 bilinear preference problem: r_i(u, v) = u^T Theta_i v with Theta_i = Theta_init + U* W*_i + E_i, and
the metrics the theory speaks about (held-out accuracy per user, parameter error, subspace distance).

Share Rep here (spec §3.6 decision: the linear shared-representation model of Zhong / Park et al.) has no layers to
split 70 / 30: vec(Delta Theta_i) = Psi omega_i, where Psi (d1 d2 x k, k' = k) maps the features vec(u v^T) to a
k-dimensional representation shared by every user (the "bottom 70%") and omega_i (k) is user i's linear head (the
"top 30%"). Nothing here is pre-trained, so Psi is learned jointly with the heads on every user's pairs, from the
first step; the 70 / 30 proportion itself has no counterpart. `depth` does not apply to it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator
from torch import Tensor, nn

from collabalign.config import Probability, Strict
from collabalign.lora import Blocks, inject_lora, routed
from collabalign.methods.pshare_lora.sharing import user_deltas
from collabalign.methods.pshare_lora.train import METHODS, Prefs, per_user_mean, prepare, schedule, train
from collabalign.models.reward import pair_correct
from collabalign.seeding import Seeds

SYNTHETIC_METHODS = (*METHODS, "share_rep_phased")  # the same-head variant needs a score head: text only


class ProblemConfig(Strict):
    d1: PositiveInt = 32
    d2: PositiveInt = 8
    users: PositiveInt = 10
    k: PositiveInt = 2  # rank of the shared part of the truth (and the LoRA rank)
    signal: NonNegativeFloat = 0.5  # s: ||Delta Theta*_i||_F ~ 2 at the defaults, oracle accuracy ~ 0.79
    rho: Probability = 0.6  # agreement: 0 independent users, 1 one global reward
    tail: NonNegativeFloat = 0.0  # eta: individual full-rank deviations (Sigma_tail > 0)
    spectrum_decay: PositiveFloat = 1.0  # row j of every W*_i scaled by decay^j: smaller nu as it falls
    init_scale: NonNegativeFloat = 0.0  # Theta_init = init_scale * G / sqrt(d1), known to every method
    n_train: PositiveInt = 100  # N_p, pairs per user
    n_test: PositiveInt = 2000
    depth: PositiveInt = 1  # LoRA layers in the model: depth - 1 identity-initialised v-side maps below Theta

    @model_validator(mode="after")
    def _rank_fits(self) -> ProblemConfig:
        if self.k > self.d1:
            raise ValueError(f"k = {self.k} exceeds d1 = {self.d1}: the shared basis has d1 rows")
        return self


class TrainConfig(Strict):
    steps: PositiveInt = 1500  # the same budget for every method (spec §3.3)
    lr: PositiveFloat = 0.02
    linear_schedule: bool = False  # spec §8.1: constant Adam rate; True: the paper's linear decay to 0
    batch_size: NonNegativeInt = 0  # 0: full batch (spec §8.1); else mixed-user mini-batches
    norm_projection: bool = True  # ||Delta Theta_i||_F <= norm_slack * max_i ||Delta Theta*_i||_F after every step
    norm_slack: PositiveFloat = 1.1
    global_fraction: Probability = 2 / 3  # G and the phased Share Rep ablation: the global phase
    warmup_fraction: Probability = 0.1  # WU: 0.3 of 3 epochs


@dataclass
class Truth:
    """Theta_init (d1, d2), the true updates Delta Theta*_i (N, d1, d2) and B° (d1, k), the top-k left singular
    vectors of [Delta Theta*_1 .. Delta Theta*_N]."""

    theta_init: Tensor
    delta: Tensor
    basis: Tensor

    def spectrum(self, k: int) -> tuple[Tensor, Tensor]:
        """Singular values of [Delta Theta*_1 .. Delta Theta*_N] and each user's bias b_i against its best rank-k
        approximation (float64)."""
        n = self.delta.shape[0]
        agg = torch.cat(list(self.delta), dim=1).double()
        u, s, vh = torch.linalg.svd(agg, full_matrices=False)
        best = (u[:, :k] * s[:k]) @ vh[:k]
        return s, (agg - best).reshape(agg.shape[0], n, -1).square().sum(dim=(0, 2))

    def diversity(self, k: int) -> dict[str, float]:
        """nu = sigma_k^2 / N, Sigma_tail and the per-user bias b_i (mean and max), Def. 4.1."""
        n = self.delta.shape[0]
        s, bias = self.spectrum(k)
        return {"nu": float(s[k - 1] ** 2 / n), "sigma_tail": float(s[k:].square().sum()),
                "bias_mean": float(bias.mean()), "bias_max": float(bias.max())}


def generate(cfg: ProblemConfig, seed: int) -> tuple[Truth, Prefs, Prefs]:
    """Ground truth and per-user train / test pairs (labels drawn from the BTL model of each user)."""
    g = Seeds(seed).torch("pshare-synthetic")
    n, k, d1, d2, s = cfg.users, cfg.k, cfg.d1, cfg.d2, cfg.signal
    basis_true = torch.linalg.qr(torch.randn(d1, k, generator=g))[0]
    mean = torch.randn(k, d2, generator=g)
    w = s * (cfg.rho ** 0.5 * mean + (1 - cfg.rho) ** 0.5 * torch.randn(n, k, d2, generator=g))
    w = w * (cfg.spectrum_decay ** torch.arange(k, dtype=w.dtype)).view(1, k, 1)
    delta = basis_true @ w + cfg.tail * s * torch.randn(n, d1, d2, generator=g) / d1 ** 0.5
    theta_init = cfg.init_scale * torch.randn(d1, d2, generator=g) / d1 ** 0.5
    u, _, _ = torch.linalg.svd(torch.cat(list(delta), dim=1), full_matrices=False)
    truth = Truth(theta_init, delta, u[:, :k])
    return truth, pairs(truth, cfg.n_train, g), pairs(truth, cfg.n_test, g)


def pairs(truth: Truth, per_user: int, g: torch.Generator) -> Prefs:
    """`per_user` pairs for each user, tau = (u, v) Gaussian, o ~ Bernoulli(sigmoid(r*(tau0) - r*(tau1)))."""
    n, d1, d2 = truth.delta.shape
    users = torch.arange(n).repeat_interleave(per_user)
    x0, x1 = torch.randn(2, len(users), d1 + d2, generator=g)
    return labelled(truth, users, x0, x1, g)


def labelled(truth: Truth, users: Tensor, x0: Tensor, x1: Tensor, g: torch.Generator) -> Prefs:
    """The pairs (x0, x1) of `users` as chosen / rejected, o ~ Bernoulli(sigmoid(r*(x0) - r*(x1))) per the BTL model
    of each user's true reward."""
    theta = truth.theta_init + truth.delta
    diff = true_reward(theta, users, x0) - true_reward(theta, users, x1)
    o = torch.rand(len(users), generator=g) < torch.sigmoid(diff)
    return Prefs(users, torch.where(o[:, None], x0, x1), torch.where(o[:, None], x1, x0))


def true_reward(theta: Tensor, users: Tensor, x: Tensor) -> Tensor:
    """u^T Theta_user v for rows x = [u, v]."""
    d1 = theta.shape[1]
    return torch.einsum("nd,nde,ne->n", x[:, :d1], theta[users], x[:, d1:])


class BilinearNet(nn.Module):
    """r(u, v) = u . f(v) with f a stack of linear maps (identity below, Theta_init on top): LoRA on every map.

    f is linear, so each user's effective Theta is read off by passing the identity (see `effective_delta`)."""

    def __init__(self, theta_init: Tensor, depth: int = 1):
        super().__init__()
        d1, d2 = theta_init.shape
        maps = []
        for _ in range(depth - 1):
            m = nn.Linear(d2, d2, bias=False)
            m.weight.data = torch.eye(d2)
            maps.append(m)
        top = nn.Linear(d2, d1, bias=False)
        top.weight.data = theta_init.clone()
        self.f = nn.Sequential(*maps, top)
        self.d1 = d1

    def forward(self, x: Tensor) -> Tensor:
        return (x[:, :self.d1] * self.f(x[:, self.d1:])).sum(-1)


def model_for(truth: Truth, rank: int, depth: int = 1) -> BilinearNet:
    """The bilinear reward model with LoRA (rank `rank`, scale 1) on every map, base weights frozen."""
    net = BilinearNet(truth.theta_init, depth)
    inject_lora(net, [r"f\.\d+"], rank, alpha=rank)
    return net


class RepresentationNet(nn.Module):
    """r(u, v) = score(vec(u v^T)), score's frozen weight vec(Theta_init): with LoRA on `score`, A = Psi^T (k x d1 d2)
    is the shared representation and B_i = omega_i^T (1 x k) user i's head, so Share Rep trains as share-A."""

    def __init__(self, theta_init: Tensor):
        super().__init__()
        self.d1, self.d2 = theta_init.shape
        self.score = nn.Linear(self.d1 * self.d2, 1, bias=False)
        self.score.weight.data = theta_init.reshape(1, -1).clone()

    def forward(self, x: Tensor) -> Tensor:
        u, v = x[:, :self.d1], x[:, self.d1:]
        return self.score((u[:, :, None] * v[:, None, :]).flatten(1)).squeeze(-1)


def representation_model(truth: Truth, rank: int) -> RepresentationNet:
    """Share Rep's model: Psi of `rank` columns (k' = k, spec §8.1) on the features, scale 1, base frozen."""
    net = RepresentationNet(truth.theta_init)
    inject_lora(net, ["score"], rank, alpha=rank)
    return net


@torch.no_grad()
def effective_delta(net: BilinearNet | RepresentationNet, n_users: int) -> Tensor:
    """Each user's learned Theta_i - Theta_init, (N, d1, d2): Share Rep's reshaped B_i A, else one routed pass of the
    identity basis."""
    if isinstance(net, RepresentationNet):
        return user_deltas(net.score).reshape(-1, net.d1, net.d2).expand(n_users, -1, -1)
    d2 = net.f[0].base.in_features
    eye = torch.eye(d2).repeat(n_users, 1)
    with routed(net, Blocks(n_users)):
        y = net.f(eye)  # (N d2, d1): row j of user i is Theta_i e_j
    base = net.f[-1].base.weight
    return y.reshape(n_users, d2, -1).transpose(1, 2) - base


@torch.no_grad()
def evaluate(net: BilinearNet | RepresentationNet, truth: Truth, test: Prefs) -> dict:
    """Held-out accuracy per user (ties 0.5) and mean, agreement with the true sign, parameter error
    (1/N) sum ||Delta^_i - Delta*_i||_F^2, reward-difference MSE and dist(B^, B°) (Def. A.1)."""
    n, k = truth.delta.shape[0], truth.basis.shape[1]
    layout = test.blocks(n)
    with routed(net, layout if layout is not None else torch.cat([test.users, test.users])):
        r = net(torch.cat([test.chosen, test.rejected]))
    m = len(test)
    diff = r[:m] - r[m:]
    theta = truth.theta_init + truth.delta
    true_diff = true_reward(theta, test.users, test.chosen) - true_reward(theta, test.users, test.rejected)
    right = pair_correct(r[:m], r[m:])
    per_user = per_user_mean(test.users, right, n)
    oracle = per_user_mean(test.users, (true_diff > 0).double(), n)
    delta = effective_delta(net, n)
    u = torch.linalg.svd(torch.cat(list(delta), dim=1).double(), full_matrices=False)[0][:, :k]
    overlap = (u.T @ truth.basis.double()).square().sum()
    return {"accuracy": float(per_user.mean()), "accuracy_per_user": [round(float(a), 4) for a in per_user],
            "sign_agreement": float(((diff > 0) == (true_diff > 0)).double().mean()),
            "param_error": float((delta - truth.delta).square().sum(dim=(1, 2)).mean()),
            "reward_diff_mse": float((diff - true_diff).square().mean()),
            "subspace_dist": float((k - overlap).clamp_min(0).sqrt()), "oracle_accuracy": float(oracle.mean())}


def fit_model(truth: Truth, data: Prefs, problem: ProblemConfig, tc: TrainConfig, method: str,
              generator: torch.Generator) -> tuple[BilinearNet | RepresentationNet, list[float]]:
    """`method` trained on `data` by the §8.1 recipe (the same step budget for every method; the personal factors
    projected to norm_slack x the largest true update after every step); returns the model and its losses. Share Rep
    is `RepresentationNet` trained as share-A (Psi shared, the heads omega_i per user) over the whole budget."""
    if method not in SYNTHETIC_METHODS:
        raise ValueError(f"{method!r} does not run on the bilinear problem; known: {', '.join(SYNTHETIC_METHODS)}")
    rep = method == "share_rep"
    net = representation_model(truth, problem.k) if rep else model_for(truth, problem.k, problem.depth)
    prepare(net, method, problem.users, generator)
    phases = schedule("share_a" if rep else method, 1 if rep else problem.depth, tc.steps, tc.lr, tc.linear_schedule,
                      tc.global_fraction, tc.warmup_fraction)
    max_norm = tc.norm_slack * float(truth.delta.flatten(1).norm(dim=1).max()) if tc.norm_projection else None
    losses = train(net, data, phases, problem.users, tc.batch_size, generator, max_norm)
    return net, losses
