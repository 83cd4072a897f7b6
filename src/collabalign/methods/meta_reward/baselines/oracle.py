"""The oracle the spec adds (§3.5): Algorithm 2 in the target domain weighted by the judge itself (its log-odds of
a positive review), the best any reward model could give reward-weighted regression."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from collabalign.methods.meta_reward.baselines.bt_rwr import bt_rwr
from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import TextTask


def judge_logits(probabilities: np.ndarray) -> Tensor:
    """P(positive) -> log-odds, clipped away from 0 and 1 so the weights stay finite."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-6, 1 - 1e-6)
    return torch.as_tensor(np.log(p) - np.log1p(-p))


def oracle(task: TextTask, theta_sft: Params, judge_probabilities: np.ndarray, rows: Tensor, beta: float,
           alpha: float, steps: int, batch: int, gen: torch.Generator, weight_norm: str = "none") -> list[Tensor]:
    """Reward-weighted regression on `rows` with the judge's log-odds of every cached response as the reward."""
    return bt_rwr(task, theta_sft, judge_logits(judge_probabilities), rows, beta, alpha, steps, batch, gen,
                  weight_norm)
