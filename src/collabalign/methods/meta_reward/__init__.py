"""The meta-learned reward model (spec: docs/methods/meta-reward.md), by module:

- `bilevel`: the bilevel program for any policy and reward given as functions of their parameters (inner
  reward-weighted regression, reverse-mode hypergradient through the inner loop, finite differences);
- `text`: Algorithms 1 and 2 on a language-model policy adapted on its LM head, and A_PL (Eq. 26);
- `baselines`: the LM baselines, one module each (SFT, PPO(TR), PPO(TR+TE), DPO, HPL, BT+RWR, oracle);
- `entry`: the entry point, `train_meta_reward(MetaRewardConfig(held_out=...), "pairs.jsonl")`.

Variant A, the log-linear multi-domain contextual bandit with Algorithms 1 and 2 and its exact baselines, is the
reproduction's problem: `experiments/meta_reward/problems/bandit`.
"""

from collabalign.methods.meta_reward.bilevel import (
    Hypergradient,
    finite_difference,
    hypergradient,
    inner_loop,
    pl_loss,
    reward_weights,
)
from collabalign.methods.meta_reward.entry import MetaRewardConfig, train_meta_reward

__all__ = ["Hypergradient", "MetaRewardConfig", "finite_difference", "hypergradient", "inner_loop", "pl_loss",
           "reward_weights", "train_meta_reward"]
