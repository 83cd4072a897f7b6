"""The reproduction's vectorised synthetic problems (docs/methods/firm.md §8): the federated quadratic (R1), T-FIRM
with its TD(0) critic on a tabular MOMDP (R2) and toy federated alignment with PPO (R3), on the solver and λ rules
of `methods.firm`."""
