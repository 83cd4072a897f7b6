"""DPO (Rafailov et al.) on the training domains' pairs with π_SFT as the reference (spec §3.5); the sigmoid loss is
the policy layer's `dpo_loss`."""

from __future__ import annotations

import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import Pairs, TextTask, train_steps
from collabalign.policy.dpo import dpo_loss


def dpo(task: TextTask, theta_sft: Params, pairs: Pairs, beta: float, steps: int, lr: float, batch: int,
        gen: torch.Generator) -> list[Tensor]:
    """`steps` SGD steps on the mean DPO loss at `beta` over minibatches of `pairs`, from and against θ_SFT."""
    if not beta > 0:
        raise ValueError(f"DPO β must be > 0, got {beta}")
    rows = torch.cat([pairs.chosen, pairs.rejected])
    with torch.no_grad():
        reference = task.head.logprobs(theta_sft, rows)
    n = len(pairs)

    def loss(theta: Params, idx: Tensor) -> Tensor:
        logprobs = task.head.logprobs(theta, torch.cat([pairs.chosen[idx], pairs.rejected[idx]]))
        k = len(idx)
        return dpo_loss(logprobs[:k], logprobs[k:], reference[idx], reference[n + idx], beta)[0].mean()

    return train_steps(loss, theta_sft, torch.arange(n), steps, lr, batch, gen)
