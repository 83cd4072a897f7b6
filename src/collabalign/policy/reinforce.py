"""REINFORCE with the RLOO baseline (Ahmadian et al. 2024): each of k samples of a prompt is judged against the
mean reward of the other k - 1, an unbiased baseline that needs no critic."""

from __future__ import annotations

from torch import Tensor


def rloo_advantages(rewards: Tensor, k: int) -> Tensor:
    """r_i minus the mean of the other k - 1 rewards of its group, for rows grouped as k consecutive samples; rewards
    (N,) or (N, M), one column per objective."""
    grouped = rewards.reshape(-1, k, *rewards.shape[1:])
    return (grouped - (grouped.sum(1, keepdim=True) - grouped) / (k - 1)).reshape(rewards.shape)

