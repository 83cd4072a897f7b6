"""PPO on a `Policy` (TRL's classic PPOTrainer, which trl 1.x no longer ships) with M objectives: per-objective
token rewards, critics and advantages, and a per-step combination of the M clipped losses (fixed weights, or a
callable on their gradients such as FIRM's regularised MGDA)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from collabalign.config import Strict
from collabalign.policy.model import Policy
from collabalign.policy.multi_objective import objective_gradients, write_gradient
from collabalign.policy.rollout import Rollout

Weights = Tensor | Callable[[Tensor], Tensor] | None


class PPOConfig(Strict):
    """PPO hyperparameters (TRL's classic defaults; docs/methods/firm.md §3.1)."""

    clip: float = Field(0.2, gt=0)
    value_clip: float = Field(0.2, gt=0)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    whiten: bool = True
    advantage: Literal["gae", "sequence"] = "gae"
    minibatch: int = Field(8, ge=1)
    epochs: int = Field(1, ge=1)
    kl_init: float = Field(0.2, ge=0)
    kl_target: float = Field(0.03, gt=0)
    kl_horizon: int = Field(10000, ge=1)
    max_grad_norm: float | None = Field(None, gt=0)
    actor_lr: float = Field(6e-5, gt=0)
    critic_lr: float = Field(1e-4, gt=0)


@dataclass
class AdaptiveKL:
    """Adaptive KL coefficient (Ziegler et al. 2019; TRL): nudged so the observed KL tracks `target`."""

    value: float
    target: float
    horizon: int

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], cfg: PPOConfig) -> AdaptiveKL:
        """The coefficient saved by `state()` in `state`, or cfg.kl_init when there is none yet."""
        return cls(float(state["kl_coef"]) if "kl_coef" in state else cfg.kl_init, cfg.kl_target, cfg.kl_horizon)

    def state(self) -> dict[str, np.ndarray]:
        """{'kl_coef': value}, to keep in a client's private state or a checkpoint."""
        return {"kl_coef": np.array(self.value, dtype=np.float64)}

    def update(self, kl: float, n_steps: int) -> float:
        """coef *= 1 + clip(kl / target - 1, ±0.2) * n_steps / horizon; returns the new coefficient."""
        err = float(np.clip(kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + err * n_steps / self.horizon
        return self.value


@dataclass
class PPOBatch:
    """A scored rollout ready for PPO epochs: old and reference log-probs (B, T), and per objective the old values,
    advantages and returns (B, T, M); `kl` is each sequence's summed KL to the reference (B,)."""

    rollout: Rollout
    old_logprobs: Tensor
    ref_logprobs: Tensor
    old_values: Tensor
    advantages: Tensor
    returns: Tensor
    kl: Tensor
    rewards: Tensor


def gae(rewards: Tensor, values: Tensor, gamma: float, lam: float) -> Tensor:
    """Generalised advantage estimates (B, T, M), with rewards and values zero past each response's end."""
    advantages = torch.zeros_like(rewards)
    running = next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        advantages[:, t], next_value = running, values[:, t]
    return advantages


def whiten(x: Tensor, mask: Tensor) -> Tensor:
    """(x - mean) / std per objective over the masked tokens of x (B, T, M), zero where masked."""
    m = mask[..., None].float()
    n = m.sum((0, 1))
    mean = (x * m).sum((0, 1)) / n
    var = (((x - mean) * m) ** 2).sum((0, 1)) / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + 1e-8) * m


@torch.no_grad()
def prepare(policy: Policy, rollout: Rollout, rewards: Tensor, kl_coef: float, cfg: PPOConfig) -> PPOBatch:
    """Old/reference log-probs and values; token rewards R^j = -kl_coef (log pi_old - log pi_ref) + 1[last] r^j;
    advantages per objective by GAE, or one per sequence (return minus the first state's value) broadcast over
    tokens; returns = advantages + values (the sequence return at every token in sequence mode); advantages then
    whitened per objective over the batch's response tokens."""
    mask = rollout.mask
    rewards = rewards.to(policy.device, torch.float32)
    if rewards.shape != (len(rollout), policy.objectives):
        raise ValueError(f"rewards must be (B, M) = {(len(rollout), policy.objectives)}, got {tuple(rewards.shape)}")
    if not mask.any(1).all():
        raise ValueError("every response needs at least one token")
    old_logprobs, values = policy(rollout)
    ref_logprobs = policy.token_logprobs(rollout, reference=True)
    m = mask[..., None].float()
    values = values * m
    kl = old_logprobs - ref_logprobs
    rows = torch.arange(len(rollout), device=mask.device)
    score = torch.zeros_like(values)
    score[rows, mask.sum(1) - 1] = rewards
    token_rewards = (score - kl_coef * kl[..., None]) * m
    if cfg.advantage == "gae":
        advantages = gae(token_rewards, values, cfg.gamma, cfg.lam)
        returns = advantages + values
    else:
        discount = cfg.gamma ** torch.arange(mask.shape[1], device=mask.device, dtype=torch.float32)
        total = (token_rewards * discount[None, :, None]).sum(1)  # (B, M)
        advantages = (total - values[:, 0])[:, None, :] * m
        returns = total[:, None, :] * m
    if cfg.whiten:
        advantages = whiten(advantages, mask)
    return PPOBatch(rollout, old_logprobs, ref_logprobs, values, advantages, returns, kl.sum(1), rewards)


def ppo_losses(policy: Policy, batch: PPOBatch, rows: Tensor, cfg: PPOConfig) -> tuple[Tensor, Tensor, dict]:
    """On the minibatch `rows`, from one shared forward: the M clipped policy losses (M,), the clipped value loss
    summed over objectives, and float stats."""
    rollout = batch.rollout.select(rows)
    logprobs, values = policy(rollout)
    m = rollout.mask.float()
    n = m.sum()
    old, adv = batch.old_logprobs[rows], batch.advantages[rows]
    old_values, returns = batch.old_values[rows], batch.returns[rows]
    ratio = torch.exp(logprobs - old)
    clipped = ratio.clamp(1 - cfg.clip, 1 + cfg.clip)
    per_token = torch.maximum(-adv * ratio[..., None], -adv * clipped[..., None])
    policy_losses = (per_token * m[..., None]).sum((0, 1)) / n
    values_clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    value_err = torch.maximum((values - returns) ** 2, (values_clipped - returns) ** 2)
    value_loss = 0.5 * ((value_err * m[..., None]).sum((0, 1)) / n).sum()
    with torch.no_grad():
        log_ratio = logprobs - old
        stats = {"clipfrac": float((((ratio - 1).abs() > cfg.clip).float() * m).sum() / n),
                 "approx_kl": float((0.5 * log_ratio**2 * m).sum() / n)}
    return policy_losses, value_loss, stats


def ppo_update(policy: Policy, actor_opt: torch.optim.Optimizer, critic_opt: torch.optim.Optimizer,
               batch: PPOBatch, cfg: PPOConfig, generator: torch.Generator, weights: Weights = None) -> dict:
    """cfg.epochs passes over shuffled minibatches. Each step combines the M policy losses with `weights`: fixed (M,)
    (None: uniform) back-propagates sum_j w_j L^j; a callable gets the gradients G (d, M) and returns lambda (M,),
    and sum_j lambda_j g_j is written into the adapters' .grad. The critic steps with its own optimiser."""
    params = policy.adapter_params()
    m_obj = batch.advantages.shape[-1]
    fixed = None if callable(weights) else (torch.full((m_obj,), 1.0 / m_obj) if weights is None else weights)
    log: dict[str, list] = {"lambdas": [], "policy_loss": [], "value_loss": [], "clipfrac": [], "approx_kl": []}
    for _ in range(cfg.epochs):
        for rows in torch.randperm(len(batch.rollout), generator=generator).split(cfg.minibatch):
            policy_losses, value_loss, stats = ppo_losses(policy, batch, rows, cfg)
            actor_opt.zero_grad(set_to_none=True)
            critic_opt.zero_grad(set_to_none=True)
            if fixed is None:
                grads = objective_gradients(policy_losses, params)
                lam = weights(grads).detach().to(grads)
                write_gradient(params, grads @ lam)
            else:
                lam = fixed.to(policy_losses)
                (policy_losses @ lam).backward()
            value_loss.backward()
            if cfg.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                torch.nn.utils.clip_grad_norm_(policy.value_params(), cfg.max_grad_norm)
            actor_opt.step()
            critic_opt.step()
            log["lambdas"].append(lam.detach().cpu().numpy().astype(np.float64))
            log["policy_loss"].append(policy_losses.detach().cpu().numpy().astype(np.float64))
            log["value_loss"].append(float(value_loss.detach()))
            log["clipfrac"].append(stats["clipfrac"])
            log["approx_kl"].append(stats["approx_kl"])
    return {**log, "kl": float(batch.kl.mean()), "reward": batch.rewards.mean(0).cpu().numpy().astype(np.float64)}


def optimizers(policy: Policy, cfg: PPOConfig) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """Adam for the actor (the adapters, cfg.actor_lr) and for the critic (the value heads, cfg.critic_lr)."""
    return (torch.optim.Adam(policy.adapter_params(), lr=cfg.actor_lr),
            torch.optim.Adam(policy.value_params(), lr=cfg.critic_lr))
