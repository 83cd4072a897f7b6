"""FIRM: federated in-client regularised multi-objective alignment (spec: docs/methods/firm.md). The regularised
MGDA solver every variant shares, the λ rules of FIRM and its baselines (FedCMOO-A, FedAvg-LS, FMOL), and the
vectorised synthetic problems of the reproduction: the federated quadratic (R1), T-FIRM with its TD(0) critic on a
tabular MOMDP (R2) and toy federated alignment with PPO (R3); `train_firm`, the entry point on a user's prompts."""

from collabalign.methods.firm import quadratic, tfirm, toy
from collabalign.methods.firm.entry import FIRMConfig, train_firm
from collabalign.methods.firm.rules import Rule, Traffic, disagreement, dispersion, server_weights, stationarity
from collabalign.methods.firm.solver import (
    active_set,
    closed_form,
    gram,
    normalise,
    penalty,
    project_simplex,
    projected_gradient,
    qp,
    regularised,
    solve,
)

__all__ = ["FIRMConfig", "Rule", "Traffic", "active_set", "closed_form", "disagreement", "dispersion", "gram",
           "normalise", "penalty", "project_simplex", "projected_gradient", "qp", "quadratic", "regularised",
           "server_weights", "solve", "stationarity", "tfirm", "toy", "train_firm"]
