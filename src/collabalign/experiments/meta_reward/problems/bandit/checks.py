"""Checks of the bandit's hypergradient: against central finite differences, and the printed (wrong) Eq. 13."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from collabalign.experiments.meta_reward.problems.bandit.training import MetaObjectives, inner_batches, outer_batch
from collabalign.experiments.meta_reward.problems.bandit.world import DTYPE, BanditSettings, BanditWorld, world_slice
from collabalign.methods.meta_reward.bilevel import finite_difference, hypergradient


def check_hypergradient(world: BanditWorld, theta_sft: Tensor, fold: int, st: BanditSettings, gen: torch.Generator,
                        steps: int = 5, eps: float = 1e-5) -> dict[str, float]:
    """`bilevel.hypergradient` against central finite differences on a small instance of the bandit (seed 0, one
    training domain, s_h = 0 and 1 batched, β = 1, a random φ): the largest error relative to max |g|, the
    first-order approximation's relative difference, and the printed Eq. 13's relative error (s_h = 0 run, where θ
    and φ both live in the K feature coordinates)."""
    if not 0 <= fold < world.n_dom:
        raise ValueError(f"held-out domain {fold} is outside 0..{world.n_dom - 1}")
    small, T = world_slice(world, 0), torch.full((1, 1), (fold + 1) % world.n_dom)
    objectives = MetaObjectives(torch.tensor([[0.0, 1.0]], dtype=DTYPE), torch.ones(1, 2, dtype=DTYPE), st)
    E = small.fine.fex.shape[2]
    idx = torch.rand((1, 1, steps, E), generator=gen).argsort(-1)[..., :st.inner_batch]
    batches = inner_batches(small, T, idx)
    picks, dF, pair_w = outer_batch(small, T, st.outer_batch, gen)
    phi = [0.5 * torch.randn(1, 1, 2, world.features, generator=gen, dtype=DTYPE)]
    start = theta_sft[:1, None]  # (1, 1, 2, N + 1, K): s_h = 0 and 1
    theta0 = [start[..., 0, :], start[..., 1 + T[0, 0], :]]
    args = (objectives.inner, objectives.outer, theta0, phi, batches, (dF, pair_w), st.alpha)
    exact = hypergradient(*args).grad[0]
    first = hypergradient(*args, first_order=True).grad[0]
    fd = finite_difference(*args, eps)[0]
    scale = float(fd.abs().max())
    t, ex = int(T[0, 0]), idx[0, 0]
    inner = [(psi[0, 0], small.fine.response[0, t, ex[d]], f[0, 0]) for d, (psi, f) in enumerate(batches)]
    p = picks[0, 0]
    outer = (small.pairs.F[0, t, p], small.pairs.chosen[0, t, p], small.pairs.rejected[0, t, p])
    printed = paper_eq13(theta0[1][0, 0, 0], phi[0][0, 0, 0], inner, outer, st.alpha, 1.0, st.weight_decay)
    return {"relative_error": float((exact - fd).abs().max()) / scale, "max_abs_gradient": scale,
            "first_order_relative_difference": float((first - exact).abs().max()) / scale,
            "paper_eq13_relative_error": float((printed - fd[0, 0, 0]).abs().max() / fd[0, 0, 0].abs().max())}



def paper_eq13(theta0: Tensor, phi: Tensor, inner: Sequence[tuple[Tensor, Tensor, Tensor]],
               outer: tuple[Tensor, Tensor, Tensor], alpha: float, beta: float, weight_decay: float = 0.0) -> Tensor:
    """Eq. 13 AS PRINTED, for a log-linear policy π_θ(y|x) = softmax_y(ψ(x, y)ᵀθ) and a linear reward r = φᵀf. It
    is WRONG (spec §3.2): it drops σ(-Δ) and the minus sign of Eq. 30, has no ∇_φ r at all, and repeats step t's
    factor inside the product (index t for j). Read literally with gradients as row vectors (Appendix B's
    convention), each summand R^t ∇F^t (I + α R^t ∇²F^t)^{D-1-t} is a θ-space row vector, and so is the leading
    (α/β)(∇log π(y_k) - ∇log π(y'_k)); the only product of the two that is a vector is elementwise, so the result
    is a θ-space vector, not a φ-gradient. Minibatches are averaged, as in the corrected rule.

    inner: per step (ψ (B, V, dθ) candidates' features, y (B,) sampled responses, f (B, dφ) their reward features);
    outer: (ψ (B', V, dθ), chosen (B',), rejected (B',)). θ_t follow the same inner loop as `bilevel.inner_loop`."""
    if not beta > 0:
        raise ValueError(f"β must be > 0, got {beta}")
    theta, total, D = theta0.detach().clone(), torch.zeros_like(theta0), len(inner)
    eye = torch.eye(theta0.numel(), dtype=theta0.dtype)
    for t, (psi, y, f) in enumerate(inner):
        R = torch.exp(f @ phi / beta)  # (B,)
        p = torch.softmax(psi @ theta, -1)
        mean = torch.einsum("bv,bvd->bd", p, psi)
        grads = psi[torch.arange(len(y)), y] - mean  # ∇_θ log π_θt(y_i|x_i)
        cov = torch.einsum("bv,bvd,bve->bde", p, psi, psi) - torch.einsum("bd,be->bde", mean, mean)
        hess = -(R[:, None, None] * cov).mean(0)  # mean_i R_i ∇²_θ log π (Hessian of log-linear = -Cov)
        step_grad = (R[:, None] * grads).mean(0)
        total = total + step_grad @ torch.linalg.matrix_power(eye + alpha * hess, D - 1 - t)
        theta = theta + alpha * (step_grad - weight_decay * theta)
    psi, chosen, rejected = outer
    rows = torch.arange(len(chosen))
    diff = (psi[rows, chosen] - psi[rows, rejected]).mean(0)  # log Z cancels in the difference of gradients
    return alpha / beta * diff * total
