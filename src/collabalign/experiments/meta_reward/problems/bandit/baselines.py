"""The baselines of the bandit reproduction that learn from the training domains' preference pairs (spec §3.5, §8.1):
the Bradley-Terry reward model (then RWR with it, or PPO), exact-expectation KL-regularised policy gradient ("PPO"),
DPO and HPL. All start from θ_SFT, run full-batch in the joint layout (S, M, N + 1, K) and keep the policy's L2
weight decay λ on the blocks their data reach (the shared block when s_h = 1 and the blocks of the domains they
train on), so a domain without data keeps its SFT block exactly. Step sizes: PPO's gradient is scaled by
1 / max(1, β) and DPO's by 1 / β² (the curvature of the KL term grows like β, DPO's loss depends on θ only through
β(θ - θ_ref)); with a fixed step both diverge at the larger β of the grid, and DPO barely moves at β = 0.1."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import softplus

from collabalign.experiments.meta_reward.problems.bandit.policy import Rows, joint_eff, log_probs, margins
from collabalign.experiments.meta_reward.problems.bandit.world import DTYPE, BanditSettings, BanditWorld


def _pair_weights(world: BanditWorld, rows: Rows) -> Tensor:
    """(S, M, N, P): uniform over the valid training-domain pairs of each row (pooled over its training domains)."""
    w = world.pairs.valid[:, None] * rows.train_mask(world.n_dom)[None, :, :, None]
    return w / w.sum((-1, -2), keepdim=True)


def _decay(theta: Tensor, rows: Rows, domains: Tensor, st: BanditSettings) -> Tensor:
    """λ/2 ‖θ‖² over the blocks that the data of `domains` (M, N) reach."""
    mask = torch.cat([rows.sh[:, None], (domains > 0).to(DTYPE)], 1)[None, :, :, None]
    return st.weight_decay / 2 * (mask * theta**2).sum()


def fit_bt(world: BanditWorld, folds: Tensor, st: BanditSettings) -> Tensor:
    """φ_BT (S, H, K) per seed and held-out fold: the Bradley-Terry MLE (Eq. 2) of a linear reward on the union of
    the training domains' pairs, with ridge `bt_ridge`, by Newton's method."""
    rows = Rows(folds, torch.zeros(len(folds), dtype=DTYPE), torch.ones(len(folds), dtype=DTYPE))
    w, X = _pair_weights(world, rows), world.pairs.dF
    phi = torch.zeros(world.seeds, len(folds), world.features, dtype=DTYPE)
    eye = torch.eye(world.features, dtype=DTYPE)
    for _ in range(st.bt_newton_steps):
        z = torch.einsum("snpk,shk->shnp", X, phi)
        g = -torch.einsum("shnp,snpk->shk", w * torch.sigmoid(-z), X) + st.bt_ridge * phi
        curv = w * torch.sigmoid(z) * torch.sigmoid(-z)
        H = torch.einsum("shnp,snpk,snpl->shkl", curv, X, X) + st.bt_ridge * eye
        phi = phi - torch.linalg.solve(H, g)
    return phi


def ppo(world: BanditWorld, theta_sft: Tensor, phi: Tensor, rows: Rows, prompt_domains: Tensor,
        st: BanditSettings) -> Tensor:
    """PPO(TR) / PPO(TR+TE) with exact expectations: gradient ascent on mean_x [E_π[r_φ] - β KL(π ‖ π_SFT)] over the
    fine-tuning prompts of the domains `prompt_domains` (M, N) selects per row, minus λ/2 ‖θ‖². φ: (S, M, K)."""
    th0 = theta_sft[:, rows.sh.long()]
    F, P = world.fine.F, world.fine.F.shape[2]
    rewards = torch.einsum("snpvk,smk->smnpv", F, phi)
    ref = log_probs(F, joint_eff(th0, rows.sh)).detach()
    weight = (prompt_domains / (prompt_domains.sum(-1, keepdim=True) * P))[None, :, :, None]
    beta = rows.beta.view(1, -1, 1, 1, 1)
    step = (st.baseline_lr / rows.beta.clamp(min=1.0)).view(1, -1, 1, 1)
    theta = th0.clone()
    for _ in range(st.baseline_steps):
        theta.requires_grad_(True)
        lp = log_probs(F, joint_eff(theta, rows.sh))
        value = (weight * (lp.exp() * (rewards - beta * (lp - ref))).sum(-1)).sum()
        (g,) = torch.autograd.grad(value - _decay(theta, rows, prompt_domains, st), theta)
        theta = (theta + step * g).detach()
    return theta


def dpo(world: BanditWorld, theta_sft: Tensor, rows: Rows, st: BanditSettings) -> Tensor:
    """DPO (reference π_SFT, β per row) on the training domains' pairs: -log σ(β[Δ_θ - Δ_SFT]) + λ/2 ‖θ‖²."""
    th0 = theta_sft[:, rows.sh.long()]
    w = _pair_weights(world, rows)
    ref = margins(world.pairs, joint_eff(th0, rows.sh)).detach()
    beta = rows.beta.view(1, -1, 1, 1)
    step = (st.baseline_lr / rows.beta**2).view(1, -1, 1, 1)
    theta = th0.clone()
    for _ in range(st.baseline_steps):
        theta.requires_grad_(True)
        loss = (w * softplus(-beta * (margins(world.pairs, joint_eff(theta, rows.sh)) - ref))).sum()
        (g,) = torch.autograd.grad(loss + _decay(theta, rows, rows.train_mask(world.n_dom), st), theta)
        theta = (theta - step * g).detach()
    return theta


def hpl(world: BanditWorld, theta_sft: Tensor, rows: Rows, st: BanditSettings) -> Tensor:
    """HPL (spec §3.5 default): Eq. 7 minimised over θ directly on the training domains' pairs, + λ/2 ‖θ‖²."""
    theta = theta_sft[:, rows.sh.long()].clone()
    w = _pair_weights(world, rows)
    for _ in range(st.baseline_steps):
        theta.requires_grad_(True)
        loss = (w * softplus(-margins(world.pairs, joint_eff(theta, rows.sh)))).sum()
        (g,) = torch.autograd.grad(loss + _decay(theta, rows, rows.train_mask(world.n_dom), st), theta)
        theta = (theta - st.baseline_lr * g).detach()
    return theta
