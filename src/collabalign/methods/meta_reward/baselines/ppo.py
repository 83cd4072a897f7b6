"""PPO(TR) and PPO(TR+TE) (spec §3.5): the policy layer's PPO on the BT reward model, KL-regularised towards π_SFT
(the reference is the SFT adapter, not the base model) with a fixed coefficient β, sampling prompts from the
training domains (TR) or from the training and target domains (TR+TE). Only the LM head is adapted, so each
rollout's trunk states are computed once and the PPO epochs run on the head."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import Params
from collabalign.policy.head import HeadAdapter
from collabalign.policy.ppo import PPOConfig, optimizers, ppo_update, prepare

TextScore = Callable[[Sequence[str], Sequence[str]], np.ndarray]  # (prompts, responses) -> reward (B,)


def ppo(head: HeadAdapter, theta_sft: Params, prompts: Sequence[str], reward: TextScore, beta: float,
        iterations: int, batch: int, max_new_tokens: int, cfg: PPOConfig, gen: torch.Generator,
        log: list[dict] | None = None) -> list[Tensor]:
    """`iterations` rounds of: sample `batch` prompts, generate, score with `reward`, one PPO update (cfg.epochs
    over minibatches) with per-token KL penalty β to π_SFT, the adapter's B kept zero outside the cached
    vocabulary. Returns the adapter factors; the policy is left at
    θ_SFT with its base-model reference restored."""
    if not beta >= 0:
        raise ValueError(f"the KL coefficient β must be >= 0, got {beta}")
    policy = head.policy
    head.load(theta_sft)
    policy.set_reference(policy.adapter_state())
    policy.reset_value_heads()
    actor, critic = optimizers(policy, cfg)
    try:
        with head.only_vocab():
            for _ in range(iterations):
                pick = torch.randint(len(prompts), (batch,), generator=gen).tolist()
                rollout = policy.with_trunk(policy.generate([prompts[i] for i in pick], max_new_tokens,
                                                            generator=gen))
                scores = torch.as_tensor(np.asarray(reward(rollout.prompts, rollout.responses)),
                                         dtype=torch.float32)
                batch_ = prepare(policy, rollout, scores[:, None], beta, cfg)
                stats = ppo_update(policy, actor, critic, batch_, cfg, gen)
                if log is not None:
                    log.append({"reward": float(scores.mean()), "kl": stats["kl"]})
            return head.params()
    finally:
        head.load(theta_sft)
        policy.set_reference(None)
