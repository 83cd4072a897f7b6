"""Algorithm 1 on the bandit: meta-training of a linear reward model through `bilevel.hypergradient`, batched over
every (seed, row)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from collabalign.experiments.meta_reward.problems.bandit.metrics import validation
from collabalign.experiments.meta_reward.problems.bandit.policy import (
    Rows,
    log_weights,
    minibatch_counts,
    rwr,
    split_eff,
)
from collabalign.experiments.meta_reward.problems.bandit.world import DTYPE, BanditSettings, BanditWorld
from collabalign.methods.meta_reward.bilevel import hypergradient, pl_loss, reward_weights


@dataclass
class MetaTraining:
    """Algorithm 1's output per (seed, row): the selected φ and its trajectory."""

    phi: Tensor  # (S, M, K) selected by validation A_PL on the training domains
    phi_last: Tensor  # (S, M, K) after K outer steps
    best_step: Tensor  # (S, M)
    outer_loss: Tensor  # (K, S, M) outer loss ℓ_PL(θ_D) on each step's outer batch
    eval_steps: list[int]
    val_apl: Tensor  # (evals, S, M) pooled validation A_PL on the training domains (matched D-step policy)
    skipped: Tensor  # (S, M) outer steps whose hypergradient was not finite (φ left unchanged)


class MetaObjectives:
    """Algorithm 1's inner objective and outer loss for runs grouped (S, H, G): the G rows of a (seed, fold) train on
    the same sampled domain with the same batches, so features are stored once per group. θ = [θ_shared, θ_T] and φ
    are (S, H, G, K); an inner batch is (ψ (S, H, B, V, K) the candidates of B examples' prompts, f (S, H, B, K) the
    examples' features); an outer batch is (dF (S, H, B', K), pair weights (S, H, B'))."""

    def __init__(self, sh: Tensor, beta: Tensor, st: BanditSettings):
        self.sh, self.beta, self.st = sh[None, ..., None], beta[None], st  # (1, H, G, 1), (1, H, G)

    def eff(self, theta: Sequence[Tensor]) -> Tensor:
        return self.sh * theta[0] + theta[1]

    def inner(self, theta: Sequence[Tensor], phi: Sequence[Tensor], batch: tuple[Tensor, Tensor]) -> Tensor:
        """Σ over runs of mean_i w_i(φ) log π_θ(y_i|x_i) - λ/2 ‖θ‖²."""
        psi, f = batch
        eff = self.eff(theta)
        lse = torch.logsumexp(torch.einsum("shbvk,shgk->shgbv", psi, eff), -1)
        lp = torch.einsum("shbk,shgk->shgb", f, eff) - lse
        w = reward_weights(log_weights(torch.einsum("shbk,shgk->shgb", f, phi[0]), self.beta[..., None],
                                       self.st.reward_bound), 1.0)
        return (w * lp).mean(-1).sum() - self.st.weight_decay / 2 * sum((t**2).sum() for t in theta)

    def outer_runs(self, theta: Sequence[Tensor], pairs: tuple[Tensor, Tensor]) -> Tensor:
        """ℓ_PL (Eq. 7) per run (S, H, G) on its outer batch."""
        m = torch.einsum("shjk,shgk->shgj", pairs[0], self.eff(theta))
        w = pairs[1][:, :, None]
        return (pl_loss(m, torch.zeros_like(m)) * w).sum(-1) / w.sum(-1).clamp(min=1)

    def outer(self, theta: Sequence[Tensor], pairs: tuple[Tensor, Tensor]) -> Tensor:
        return self.outer_runs(theta, pairs).sum()


def inner_batches(world: BanditWorld, T: Tensor, idx: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Inner batches of examples `idx` (S, H, D, B) of domains T (S, H)."""
    s, t = torch.arange(world.seeds)[:, None, None, None], T[:, :, None, None]
    psi = world.fine.F[s, t, idx // world.fine.per_prompt]  # (S, H, D, B, V, K)
    f = world.fine.fex[s, t, idx]
    return [(psi[:, :, d], f[:, :, d]) for d in range(idx.shape[2])]


def outer_batch(world: BanditWorld, T: Tensor, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """`size` pairs per (seed, fold) drawn without replacement among the valid pairs of domain T (S, H) (padded
    with tied pairs at weight 0 when there are fewer): picks, dF, weights."""
    s = torch.arange(world.seeds)[:, None]
    valid = world.pairs.valid[s, T]  # (S, H, P)
    picks = (torch.rand(valid.shape, generator=gen) + 2 * valid).topk(min(size, valid.shape[-1]), -1).indices
    return picks, world.pairs.dF[s[..., None], T[..., None], picks], valid.gather(-1, picks)



def matched_validation(world: BanditWorld, theta0: Tensor, phi: Tensor, rows: Rows, st: BanditSettings,
                counts: Tensor) -> tuple[Tensor, Tensor]:
    """`validation` of the matched (D-step) RWR policy of φ on every training domain."""
    _, kept = rwr(world, theta0, phi, rows, st, counts, keep=(counts.shape[2],))
    return validation(world, split_eff(kept[counts.shape[2]], rows.sh), rows)


def meta_train(world: BanditWorld, theta_sft: Tensor, rows: Rows, st: BanditSettings, gen: torch.Generator,
               progress: bool = False) -> MetaTraining:
    """Algorithm 1 (spec §3.1) for every (seed, row) at once: each outer step samples one training domain per (seed,
    fold), restarts θ at θ_SFT, runs D inner SGD steps on minibatches of B_in, takes the hypergradient of ℓ_PL on
    B_out pairs of that domain, clips its norm per row and steps φ by SGD. Rows of one fold share domains and
    batches (common random numbers across β and s_h; every fold needs the same number of rows). Every E steps (and
    at the end) φ is scored by the pooled validation A_PL of the matched policy on the training domains; the best
    (ties: lower validation ℓ_PL, then the earlier step) is returned."""
    S, M, N, E, K = world.seeds, len(rows), world.n_dom, world.fine.fex.shape[2], world.features
    D = st.inner_steps
    folds, sizes = rows.fold.unique(return_counts=True)
    if not (sizes == sizes[0]).all():
        raise ValueError("meta_train needs the same number of rows in every fold")
    H, G = len(folds), int(sizes[0])
    order = torch.argsort(rows.fold, stable=True)  # rows grouped by fold: (H, G)
    undo = torch.argsort(order)
    theta0 = theta_sft[:, rows.sh.long()]  # (S, M, N + 1, K)
    grouped = theta0[:, order].view(S, H, G, N + 1, K)
    objectives = MetaObjectives(rows.sh[order].view(H, G), rows.beta[order].view(H, G), st)
    phi = torch.zeros(S, M, K, dtype=DTYPE)  # in the caller's row order
    eval_counts = minibatch_counts(gen, (S, N, D), E, st.inner_batch)
    best_phi, best_acc = phi.clone(), torch.full((S, M), -1.0, dtype=DTYPE)
    best_loss, best_step = torch.zeros(S, M, dtype=DTYPE), torch.zeros(S, M, dtype=torch.long)
    eval_steps = sorted(set(range(0, st.outer_steps, st.eval_every)) | {st.outer_steps})
    val_curve, losses, skipped = [], [], torch.zeros(S, M, dtype=torch.long)
    s_idx, h_idx, g_idx = torch.arange(S)[:, None, None], torch.arange(H)[:, None], torch.arange(G)
    for k in range(st.outer_steps + 1):
        if k in eval_steps:
            acc, loss = matched_validation(world, theta0, phi, rows, st, eval_counts)
            better = (acc > best_acc) | ((acc == best_acc) & (loss < best_loss))
            best_acc, best_loss = torch.where(better, acc, best_acc), torch.where(better, loss, best_loss)
            best_phi = torch.where(better[..., None], phi, best_phi)
            best_step = torch.where(better, k, best_step)
            val_curve.append(acc)
            if progress:
                print(f"meta-reward bandit: outer step {k}/{st.outer_steps}, validation A_PL {acc.mean():.3f}",
                      flush=True)
        if k == st.outer_steps:
            break
        offset = torch.randint(0, N - 1, (S, H), generator=gen)
        T = offset + (offset >= folds).long()  # a training domain per (seed, fold)
        idx = torch.rand((S, H, D, E), generator=gen).argsort(-1)[..., :st.inner_batch]
        _, dF, pair_w = outer_batch(world, T, st.outer_batch, gen)
        start = [grouped[:, :, :, 0], grouped[s_idx, h_idx, g_idx, 1 + T[..., None]]]
        phi_g = phi[:, order].view(S, H, G, K)
        hg = hypergradient(objectives.inner, objectives.outer, start, [phi_g], inner_batches(world, T, idx),
                           (dF, pair_w), st.alpha)
        with torch.no_grad():
            losses.append(objectives.outer_runs(hg.theta, (dF, pair_w)).reshape(S, M)[:, undo])
        g = hg.grad[0].reshape(S, M, K)[:, undo]
        finite = torch.isfinite(g).all(-1)
        skipped += (~finite).long()
        g = torch.where(finite[..., None], g, 0.0)
        phi = phi - st.eta * g * (st.clip / g.norm(dim=-1, keepdim=True).clamp(min=st.clip))
    outer = torch.stack(losses) if losses else torch.zeros(0, S, M, dtype=DTYPE)
    return MetaTraining(best_phi, phi, best_step, outer, eval_steps, torch.stack(val_curve), skipped)

