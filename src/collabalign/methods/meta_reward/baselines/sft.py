"""SFT (Eq. 1): maximum likelihood on the fine-tuning data of every domain, training and target (𝒟^tr ∪ 𝒟^te);
every other method starts from its result."""

from __future__ import annotations

import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import TextTask, train_steps


def sft(task: TextTask, theta0: Params, rows: Tensor, steps: int, lr: float, batch: int,
        gen: torch.Generator) -> list[Tensor]:
    """`steps` SGD steps on -mean log π_θ(y|x) over minibatches of `rows`."""
    return train_steps(lambda theta, b: -task.head.logprobs(theta, b).mean(), theta0, rows, steps, lr,
                       batch, gen)
