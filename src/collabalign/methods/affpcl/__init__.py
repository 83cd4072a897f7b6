"""AffPCL: personalised collaborative learning with affinity-based variance reduction (spec: docs/methods/affpcl.md):
one update rule and its baselines over a small problem interface, and the problems of its experiments (Gaussian
linear systems, digits users, preference annotators, tabular Markov reward processes and MDPs)."""

from collabalign.methods.affpcl.algorithm import AffPCL, run, schedule
from collabalign.methods.affpcl.baselines import IFCA, IL, Ditto, FineTune, OneStepFedAvg, PFedMe
from collabalign.methods.affpcl.entry import AffPCLConfig, train_affpcl
from collabalign.methods.affpcl.local import LocalAffPCL, LocalFedAvg
from collabalign.methods.affpcl.systems import GaussianSystems, heterogeneity, noise_alignment

__all__ = ["IFCA", "IL", "AffPCL", "AffPCLConfig", "Ditto", "FineTune", "GaussianSystems", "LocalAffPCL", "LocalFedAvg",
           "OneStepFedAvg", "PFedMe", "heterogeneity", "noise_alignment", "run", "schedule", "train_affpcl"]
