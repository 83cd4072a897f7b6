"""The bandit's policy maths: stacked rows of runs, θ_eff in the joint and split layouts, log-probabilities,
reward weights, SFT and Algorithm 2 (reward-weighted regression)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.functional import log_softmax

from collabalign.experiments.meta_reward.problems.bandit.world import (
    DTYPE,
    BanditSettings,
    BanditWorld,
    FineTuning,
    PairSet,
)
from collabalign.methods.meta_reward.bilevel import reward_weights

LOG_WEIGHT_CAP = 200.0  # float64 guard on log w = r / β (w <= e^200); never reached at β >= 1 in this world


@dataclass(frozen=True)
class Rows:
    """Settings of the runs stacked per seed: held-out fold, s_h and β of each row."""

    fold: Tensor  # (M,) long
    sh: Tensor  # (M,) 0.0 / 1.0
    beta: Tensor  # (M,)

    @classmethod
    def grid(cls, folds: Sequence[int], sh_values: Sequence[int], betas: Sequence[float], n_dom: int) -> Rows:
        """Every (fold, s_h, β), in that nesting order."""
        for h in folds:
            if not 0 <= h < n_dom:
                raise ValueError(f"held-out domain {h} is outside 0..{n_dom - 1}")
        for s in sh_values:
            if s not in (0, 1):
                raise ValueError(f"s_h must be 0 or 1, got {s}")
        for b in betas:
            if not b > 0:
                raise ValueError(f"β must be > 0, got {b}")
        combos = list(itertools.product(folds, sh_values, betas))
        if not combos:
            raise ValueError("no rows: folds, s_h values and betas must be non-empty")
        f, s, b = zip(*combos, strict=True)
        return cls(torch.tensor(f), torch.tensor(s, dtype=DTYPE), torch.tensor(b, dtype=DTYPE))

    def __len__(self) -> int:
        return len(self.fold)

    def repeat(self, times: int) -> Rows:
        return Rows(self.fold.repeat(times), self.sh.repeat(times), self.beta.repeat(times))

    def train_mask(self, n_dom: int) -> Tensor:
        """(M, N): 1 on each row's training domains."""
        return 1.0 - torch.nn.functional.one_hot(self.fold, n_dom).to(DTYPE)


def joint_eff(theta: Tensor, sh: Tensor) -> Tensor:
    """θ_eff (S, M, N, K) from the joint layout (S, M, N + 1, K)."""
    return sh.view(1, -1, 1, 1) * theta[:, :, :1] + theta[:, :, 1:]


def split_eff(theta: Tensor, sh: Tensor) -> Tensor:
    """θ_eff (S, M, N, K) from the split layout (S, M, N, 2, K)."""
    return sh.view(1, -1, 1, 1) * theta[..., 0, :] + theta[..., 1, :]


def log_probs(F: Tensor, eff: Tensor) -> Tensor:
    """log π(y|x) (S, M, N, P, V) for world features F (S, N, P, V, K)."""
    return log_softmax(torch.einsum("snpvk,smnk->smnpv", F, eff), -1)


def margins(pairs: PairSet, eff: Tensor) -> Tensor:
    """log π(chosen|x) - log π(rejected|x) (S, M, N, P); the normaliser cancels for a shared candidate set."""
    return torch.einsum("snpk,smnk->smnp", pairs.dF, eff)


def example_log_probs(fine: FineTuning, eff: Tensor) -> Tensor:
    """log π of every fine-tuning example (S, M, N, E)."""
    lse = torch.logsumexp(torch.einsum("snpvk,smnk->smnpv", fine.F, eff), -1)
    return torch.einsum("snek,smnk->smne", fine.fex, eff) - lse.repeat_interleave(fine.per_prompt, -1)


def log_weights(rewards: Tensor, beta: Tensor | float, bound: float | None) -> Tensor:
    """r / β (optionally r bounded as c·tanh(r / c)), capped at LOG_WEIGHT_CAP; exp of it is the weight of Eq. 10."""
    r = bound * torch.tanh(rewards / bound) if bound else rewards
    return (r / beta).clamp(max=LOG_WEIGHT_CAP)



def minibatch_counts(gen: torch.Generator, shape: tuple[int, ...], examples: int, batch: int) -> Tensor:
    """(*shape, examples): each minibatch (drawn without replacement) as multiplicities / batch."""
    idx = torch.rand((*shape, examples), generator=gen).argsort(-1)[..., :batch]
    return torch.zeros((*shape, examples), dtype=DTYPE).scatter_(-1, idx, 1.0 / batch)


def sft(world: BanditWorld, st: BanditSettings) -> Tensor:
    """θ_SFT (S, 2, N + 1, K) for s_h = 0 and 1: gradient ascent on the mean log-likelihood of all domains' 𝒟^T
    minus λ/2 ‖θ‖² (`sft_steps` full-batch steps of `sft_lr`)."""
    S, N = world.seeds, world.n_dom
    sh = torch.tensor([0.0, 1.0], dtype=DTYPE)
    target = world.fine.counts[:, None] / world.fine.counts[0].sum()
    theta = torch.zeros(S, 2, N + 1, world.features, dtype=DTYPE)
    for _ in range(st.sft_steps):
        theta.requires_grad_(True)
        obj = (target * log_probs(world.fine.F, joint_eff(theta, sh))).sum()
        (g,) = torch.autograd.grad(obj - st.weight_decay / 2 * (theta**2).sum(), theta)
        theta = (theta + st.sft_lr * g).detach()
    return theta


def rwr(world: BanditWorld, theta0: Tensor, phi: Tensor, rows: Rows, st: BanditSettings, counts: Tensor,
        keep: Sequence[int] = ()) -> tuple[Tensor, dict[int, Tensor]]:
    """Algorithm 2 on every domain's 𝒟^T separately: θ ← θ_0 (joint layout (S, M, N + 1, K)), then SGD ascent on
    mean_i w_i log π(y_i|x_i) - λ/2 ‖θ‖² with w = exp(r_φ / β) frozen (φ: (S, M, K)), one minibatch per step from
    `counts` (S, N, steps, E). Returns the checkpoint of minimum full-data training loss (the paper's "converged"
    rule, θ_0 included) and the parameters after each step in `keep`, both in the split layout (S, M, N, 2, K)."""
    S, M, N, steps = phi.shape[0], phi.shape[1], world.n_dom, counts.shape[2]
    theta = torch.stack([theta0[:, :, :1].expand(-1, -1, N, -1), theta0[:, :, 1:]], -2).clone()
    rewards = torch.einsum("snek,smk->smne", world.fine.fex, phi)
    w = reward_weights(log_weights(rewards, rows.beta.view(1, -1, 1, 1), st.reward_bound), 1.0)
    best, best_loss, kept = theta.clone(), torch.full((S, M, N), torch.inf, dtype=DTYPE), {}
    for t in range(steps + 1):
        theta.requires_grad_(True)
        lp = example_log_probs(world.fine, split_eff(theta, rows.sh))
        decay = st.weight_decay / 2 * (theta**2).sum((-1, -2))
        with torch.no_grad():
            loss = -(w * lp).mean(-1) + decay
            better = loss < best_loss
            best_loss = torch.where(better, loss, best_loss)
            best = torch.where(better[..., None, None], theta, best)
        if t == steps:
            break
        (g,) = torch.autograd.grad((w * counts[:, None, :, t] * lp).sum() - decay.sum(), theta)
        theta = (theta + st.alpha * g).detach()
        if t + 1 in keep:
            kept[t + 1] = theta.clone()
    return best.detach(), kept

