"""Causal-LM policies with LoRA: sampling, log-probs, KL to the adapters-off reference, value heads; PPO (one or
many objectives), the REINFORCE leave-one-out advantage and the DPO loss (their steps are the methods')."""

from collabalign.policy.dpo import dpo_loss
from collabalign.policy.model import Policy
from collabalign.policy.multi_objective import objective_gradients, write_gradient
from collabalign.policy.ppo import AdaptiveKL, PPOBatch, PPOConfig, optimizers, ppo_losses, ppo_update, prepare
from collabalign.policy.reinforce import rloo_advantages
from collabalign.policy.rollout import Rollout

__all__ = ["AdaptiveKL", "PPOBatch", "PPOConfig", "Policy", "Rollout", "dpo_loss", "objective_gradients",
           "optimizers", "ppo_losses", "ppo_update", "prepare", "rloo_advantages", "write_gradient"]
