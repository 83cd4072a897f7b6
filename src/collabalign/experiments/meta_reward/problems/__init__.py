"""The meta-learned reward model's paper-only problem: the log-linear multi-domain contextual bandit of
docs/methods/meta-reward.md §8.1 (Variant A), with exact gradients."""
