"""The two-stage ablation the spec adds (§3.5): a Bradley-Terry reward model fitted on the union of the training
domains' pairs ("multi-task", Eq. 2; the same model PPO uses), then Algorithm 2 with it in the target domain. It
isolates what meta-learning adds over the inner objective."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import Pairs, TextTask, meta_test, table_reward
from collabalign.models.text_reward import LinearHead, fit_bradley_terry


def bt_rewards(task: TextTask, pairs: Pairs, c: float = 1.0) -> tuple[LinearHead, Tensor]:
    """The BT head fitted on `pairs` (L2 strength 1/c) and its reward (logit scale) for every cached response."""
    features = task.features.numpy()
    head = fit_bradley_terry(features[pairs.chosen.numpy()], features[pairs.rejected.numpy()], c)
    return head, torch.as_tensor(head.logit(features), dtype=torch.float64)


def bt_rwr(task: TextTask, theta_sft: Params, rewards: Tensor, rows: Tensor, beta: float, alpha: float, steps: int,
           batch: int, gen: torch.Generator, weight_norm: str = "none") -> list[Tensor]:
    """Algorithm 2 on the target rows `rows` with a fixed reward table (the BT model's, or the oracle's)."""
    if not np.isfinite(rewards.numpy()).all():
        raise ValueError("the reward table has non-finite values")
    return meta_test(task, theta_sft, table_reward, [rewards], rows, beta, alpha, steps, batch, gen,
                     weight_norm=weight_norm)
