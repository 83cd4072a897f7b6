"""REINFORCE with the RLOO baseline (Ahmadian et al. 2024): each of k samples of a prompt is judged against the
mean reward of the other k - 1, an unbiased baseline that needs no critic."""

from __future__ import annotations

import torch
from torch import Tensor

from collabalign.policy.model import Policy
from collabalign.policy.rollout import Rollout


def rloo_advantages(rewards: Tensor, k: int) -> Tensor:
    """r_i minus the mean of the other k - 1 rewards of its group, for rows grouped as k consecutive samples; rewards
    (N,) or (N, M), one column per objective."""
    grouped = rewards.reshape(-1, k, *rewards.shape[1:])
    return (grouped - (grouped.sum(1, keepdim=True) - grouped) / (k - 1)).reshape(rewards.shape)


def rloo_step(policy: Policy, opt: torch.optim.Optimizer, rollout: Rollout, rewards: Tensor, k: int,
              kl_coef: float = 0.0) -> dict[str, float]:
    """One on-policy step on -mean_i A_i log pi(y_i | x_i), with A from `rloo_advantages` on r_i - kl_coef KL_i.

    Rows must be grouped by prompt: k consecutive samples of each prompt.
    """
    if k < 2 or len(rollout) % k:
        raise ValueError(f"RLOO needs k >= 2 samples per prompt and B divisible by k; got B={len(rollout)}, k={k}")
    groups = [rollout.prompts[i:i + k] for i in range(0, len(rollout), k)]
    if any(len(set(g)) != 1 for g in groups):
        raise ValueError(f"rows must be grouped by prompt, {k} consecutive samples of each")
    logprobs = policy.token_logprobs(rollout)
    kl = (logprobs.detach() - policy.token_logprobs(rollout, reference=True)).sum(1)
    shaped = rewards.to(logprobs) - kl_coef * kl
    advantages = rloo_advantages(shaped, k)
    loss = -(advantages * logprobs.sum(1)).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"loss": float(loss.detach()), "reward": float(rewards.float().mean()), "kl": float(kl.mean())}
