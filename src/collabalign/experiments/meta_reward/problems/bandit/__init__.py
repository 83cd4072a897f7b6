"""Variant A of the meta-learned reward model (spec docs/methods/meta-reward.md §8.1): a log-linear multi-domain
contextual bandit with exact expectations, one module per job:

- `world`: the settings and the generator (r* = u*ᵀs, behaviour μ^T ∝ exp(b_Tᵀ f), features f = [s, q, n] of
  K = 3·block coordinates);
- `policy`: rows of stacked runs, θ_eff, log-probabilities, reward weights, the SFT start and Algorithm 2
  (reward-weighted regression on a domain's fine-tuning data);
- `metrics`: A_PL (Eq. 26), validation on the training domains, held-out metrics;
- `training`: Algorithm 1, meta-training of a linear reward model through `bilevel.hypergradient`;
- `checks`: the hypergradient against finite differences, and the printed Eq. 13 kept as a documented wrong formula;
- `baselines`: the baselines that learn from preference pairs (BT reward model, exact PPO, DPO, HPL).

Layout: the world is stacked over seeds S and domains N; training runs are stacked as rows M (held-out fold, s_h, β,
...) per seed, so one call trains every (seed, row) at once. Policy parameters in the joint layout are
(S, M, N + 1, K) = [θ_shared, θ_1 .. θ_N]; in the split layout (one independent run per domain, Algorithm 2 applied to
each domain separately) (S, M, N, 2, K) = [θ_shared, θ_T] per domain. Either gives θ_eff (S, M, N, K) =
s_h·θ_shared + θ_T, and π_θ(y|x) = softmax_y(f(x, y)ᵀ θ_eff).
"""

from collabalign.experiments.meta_reward.problems.bandit.checks import check_hypergradient, paper_eq13
from collabalign.experiments.meta_reward.problems.bandit.metrics import heldout_metrics, preference_accuracy, validation
from collabalign.experiments.meta_reward.problems.bandit.policy import (
           Rows,
           joint_eff,
           minibatch_counts,
           rwr,
           sft,
           split_eff,
)
from collabalign.experiments.meta_reward.problems.bandit.training import MetaTraining, meta_train
from collabalign.experiments.meta_reward.problems.bandit.world import BanditSettings, BanditWorld, world_slice

__all__ = ["BanditSettings", "BanditWorld", "MetaTraining", "Rows", "check_hypergradient", "heldout_metrics",
           "joint_eff", "meta_train", "minibatch_counts", "paper_eq13", "preference_accuracy", "rwr", "sft",
           "split_eff", "validation", "world_slice"]
