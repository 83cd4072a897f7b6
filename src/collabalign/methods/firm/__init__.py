"""FIRM: federated in-client regularised multi-objective alignment (spec: docs/methods/firm.md). The regularised
MGDA solver every variant shares, the λ rules of FIRM and its baselines (FedCMOO-A, FedAvg-LS, FMOL), the federated
PPO / RLOO on a language model, and `train_firm`, the entry point on a user's prompts. The reproduction's synthetic
problems (quadratic, T-FIRM, toy alignment) are in `experiments/firm/problems`."""

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
           "normalise", "penalty", "project_simplex", "projected_gradient", "qp", "regularised",
           "server_weights", "solve", "stationarity", "train_firm"]
