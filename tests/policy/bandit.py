"""A bandit-sized RL task for the policy tests: reward = fraction of response tokens in a token set S."""

import torch
from torch import Tensor

from collabalign.policy import Policy, Rollout

PROMPTS = ["Say something.", "Hello!", "Tell me a word.", "What now?"]


def token_set_reward(policy: Policy, seed: int = 5):
    """S = the half of the vocabulary with the largest projection of its embedding on a random direction (so one
    adapter direction favours all of S), EOS excluded; about half the tokens of the untrained policy are in S."""
    emb = policy.model.get_input_embeddings().weight.detach()
    direction = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(seed))
    in_set = torch.zeros(emb.shape[0], dtype=torch.bool)
    in_set[(emb @ direction).topk(emb.shape[0] // 2).indices] = True
    in_set[policy.eos_ids] = False

    def reward(rollout: Rollout) -> Tensor:
        mask = rollout.mask
        return (in_set[rollout.input_ids[:, rollout.prompt_len:]] & mask).sum(1) / mask.sum(1)

    return reward


def mean_reward(policy: Policy, reward, seed: int = 99, copies: int = 32) -> float:
    """Mean reward of fresh samples (4 tokens) on every prompt `copies` times."""
    rollout = policy.generate(PROMPTS * copies, 4, generator=torch.Generator().manual_seed(seed), chat=False)
    return float(reward(rollout).mean())
