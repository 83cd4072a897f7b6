"""HPL (spec §3.5, §9.11): the preference objective ℓ_PL (Eq. 7) minimised directly in θ on the training domains'
pairs, no reward model and no bilevel program; the default, out-of-distribution reading (no target-domain pairs)."""

from __future__ import annotations

import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import Pairs, TextTask, pl_objective, train_steps


def hpl(task: TextTask, theta_sft: Params, pairs: Pairs, steps: int, lr: float, batch: int,
        gen: torch.Generator) -> list[Tensor]:
    """`steps` SGD steps on ℓ_PL over minibatches of `pairs`, from θ_SFT."""
    outer = pl_objective(task)
    return train_steps(lambda theta, idx: outer(theta, Pairs(pairs.chosen[idx], pairs.rejected[idx])), theta_sft,
                       torch.arange(len(pairs)), steps, lr, batch, gen)
