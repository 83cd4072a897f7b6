"""Causal-LM policies with LoRA: sampling, log-probs, KL to the adapters-off reference, value heads; PPO (one or
many objectives), REINFORCE-RLOO, DPO and weighted MLE steps."""

from collabalign.policy.dpo import dpo_loss, dpo_step
from collabalign.policy.model import Policy
from collabalign.policy.multi_objective import objective_gradients, write_gradient
from collabalign.policy.ppo import AdaptiveKL, PPOBatch, PPOConfig, optimizers, ppo_losses, ppo_update, prepare
from collabalign.policy.reinforce import rloo_advantages, rloo_step
from collabalign.policy.rollout import Rollout
from collabalign.policy.weighted_mle import rwr_weights, weighted_mle_step

__all__ = ["AdaptiveKL", "PPOBatch", "PPOConfig", "Policy", "Rollout", "dpo_loss", "dpo_step", "objective_gradients",
           "optimizers", "ppo_losses", "ppo_update", "prepare", "rloo_advantages", "rloo_step", "rwr_weights",
           "weighted_mle_step", "write_gradient"]
