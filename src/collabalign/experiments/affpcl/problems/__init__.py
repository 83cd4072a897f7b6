"""AffPCL's reproduction problems beyond the Gaussian linear systems (docs/methods/affpcl.md §5, §8): policy
evaluation and control on random MDPs (TD, SARSA), digit features, simulated annotators and misaligned systems."""
