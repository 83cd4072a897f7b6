"""Weighted maximum likelihood on given responses: SFT (weights 1) and reward-weighted regression (exp(r/tau))."""

from __future__ import annotations

import torch
from torch import Tensor

from collabalign.policy.model import Policy
from collabalign.policy.rollout import Rollout


def rwr_weights(rewards: Tensor, temperature: float) -> Tensor:
    """exp(r_i / tau) normalised to sum to 1 (reward-weighted regression, Peters & Schaal 2007)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.softmax(rewards.float() / temperature, 0)


def weighted_mle_step(policy: Policy, opt: torch.optim.Optimizer, rollout: Rollout,
                      weights: Tensor) -> dict[str, float]:
    """One step on -sum_i w_i * (mean over response tokens of log pi(y_i | x_i)). Weights summing to 1 (as
    `rwr_weights` gives) make it a weighted mean; ones make it summed SFT."""
    logprobs = policy.token_logprobs(rollout)
    mean_logprob = logprobs.sum(1) / rollout.mask.sum(1).clamp(min=1)
    loss = -(weights.to(mean_logprob) * mean_logprob).sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"loss": float(loss.detach()), "logprob": float(mean_logprob.detach().mean())}
