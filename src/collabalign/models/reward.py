"""Reward model = backbone (+ LoRA) + scalar head (a `PooledModel` with one output); Bradley–Terry loss;
preference accuracy."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from collabalign.data.preferences import PreferencePair
from collabalign.models.pooled import PooledModel, Tokens


def bt_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Bradley–Terry negative log-likelihood: mean of -log sigmoid(r_chosen - r_rejected)."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()


def pair_correct(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    """Per pair: 1 if ranked correctly, 0.5 for a tie, else 0 (float64)."""
    return (r_chosen > r_rejected).double() + 0.5 * (r_chosen == r_rejected).double()


def preference_accuracy(r_chosen: Tensor, r_rejected: Tensor) -> float:
    """Fraction of pairs ranked correctly; a tie counts as half right."""
    return float(pair_correct(r_chosen, r_rejected).mean())


def pair_texts(pairs: Sequence[PreferencePair]) -> tuple[list[str], list[str]]:
    """(prompt + chosen, prompt + rejected) for each pair: the texts a reward model scores."""
    return [p.prompt + p.chosen for p in pairs], [p.prompt + p.rejected for p in pairs]


class RewardModel(PooledModel):
    """r(x) = w . pool(h(x)) + b: a pooled model with one output, returned as shape (batch,)."""

    def __init__(self, backbone: nn.Module, causal: bool, generator: torch.Generator | None = None):
        super().__init__(backbone, causal, 1, generator)

    def forward(self, tokens: Tokens, features: Tensor | None = None, split: int = 0) -> Tensor:
        """Rewards, shape (batch,); see `PooledModel.forward` for `features` and `split`."""
        return super().forward(tokens, features, split).squeeze(-1)
