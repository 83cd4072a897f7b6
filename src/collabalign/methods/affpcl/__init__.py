"""AffPCL: personalised collaborative learning with affinity-based variance reduction, its baselines and the Gaussian
linear systems of its experiments (spec: ../shared/specs/affpcl.md)."""

from collabalign.methods.affpcl.algorithm import importance_weights, run_affpcl
from collabalign.methods.affpcl.baselines import run_ditto, run_fedavg, run_finetune, run_ifca, run_il, run_pfedme
from collabalign.methods.affpcl.systems import GaussianSystems, heterogeneity, noise_alignment

# Fig. 1's seven methods, in the paper's legend order
METHODS = {"il": run_il, "fedavg": run_fedavg, "affpcl": run_affpcl, "finetune": run_finetune, "pfedme": run_pfedme,
           "ditto": run_ditto, "ifca": run_ifca}

__all__ = ["METHODS", "GaussianSystems", "heterogeneity", "importance_weights", "noise_alignment", "run_affpcl",
           "run_ditto", "run_fedavg", "run_finetune", "run_ifca", "run_il", "run_pfedme"]
