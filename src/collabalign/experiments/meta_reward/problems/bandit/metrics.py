"""The bandit's measurements: A_PL (Eq. 26), validation on the training domains, held-out metrics."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.nn.functional import softplus

from collabalign.experiments.meta_reward.problems.bandit.policy import Rows, margins
from collabalign.experiments.meta_reward.problems.bandit.world import DTYPE, BanditWorld, PairSet


def preference_accuracy(pairs: PairSet, eff: Tensor, weights: Tensor | None = None) -> Tensor:
    """A_PL (Eq. 26; lengths are equal) per (seed, row): pooled over the domains `weights` (M, N) selects, else per
    domain (S, M, N). Ties count as errors."""
    hit = (margins(pairs, eff) > 0).to(DTYPE)
    valid = pairs.valid[:, None]
    if weights is None:
        return (hit * valid).sum(-1) / valid.sum(-1)
    w = valid * weights[None, :, :, None]
    return (hit * w).sum((-1, -2)) / w.sum((-1, -2))



def validation(world: BanditWorld, eff: Tensor, rows: Rows) -> tuple[Tensor, Tensor]:
    """Pooled A_PL and ℓ_PL (S, M) on the validation pairs of each row's training domains (never its held-out one)."""
    mask = rows.train_mask(world.n_dom)
    w = world.val.valid[:, None] * mask[None, :, :, None]
    loss = (softplus(-margins(world.val, eff)) * w).sum((-1, -2)) / w.sum((-1, -2))
    return preference_accuracy(world.val, eff, mask), loss



def heldout_metrics(world: BanditWorld, eff: Tensor, rows: Rows, temperatures: Sequence[float]) -> dict[str, Tensor]:
    """Per (seed, row) on the row's held-out domain's test pairs: A_PL, the expected true reward E_π[r*] over the test
    prompts at each temperature (π^{1/τ} renormalised), and the win rate P(r*(ŷ) > r*(y_ref)) for ŷ ~ π against the
    pair's preferred response (exact expectation; ties lose)."""
    S, M = eff.shape[:2]
    out = {"apl": torch.zeros(S, M, dtype=DTYPE), "win": torch.zeros(S, M, dtype=DTYPE)}
    out |= {f"reward@{t:g}": torch.zeros(S, M, dtype=DTYPE) for t in temperatures}
    test = world.test
    for h in rows.fold.unique().tolist():  # loop over held-out domains (at most N), each batched over rows
        sel = rows.fold == h
        e = eff[:, sel, h]  # (S, m, K)
        logits = torch.einsum("spvk,smk->smpv", test.F[:, h], e)
        valid = test.valid[:, None, h]
        margin = torch.einsum("spk,smk->smp", test.dF[:, h], e)
        out["apl"][:, sel] = ((margin > 0).to(DTYPE) * valid).sum(-1) / valid.sum(-1)
        r = test.rstar[:, None, h]  # (S, 1, P, V)
        ref = torch.take_along_dim(r, test.chosen[:, None, h, :, None], -1)
        wins = (torch.softmax(logits, -1) * (r > ref).to(DTYPE)).sum(-1)
        out["win"][:, sel] = (wins * valid).sum(-1) / valid.sum(-1)
        for t in temperatures:
            out[f"reward@{t:g}"][:, sel] = (torch.softmax(logits / t, -1) * r).sum(-1).mean(-1)
    return out

