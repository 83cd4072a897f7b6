"""Run time of the whole Fig. 1 of AffPCL (7 methods x 4 levels x 10 runs, n = 20, T = 60), vectorised over runs and
agents by the one update rule and its baselines, and its ratio to the per-agent reference loops (tests/) on the
methods both implement (IL, FedAvg, AffPCL), measured interleaved in one run. Goal: the whole figure in under 10 s.
Run: cd benchmarks && OMP_NUM_THREADS=1 ../.venv/bin/python affpcl_speed.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from timing import compare

from collabalign.methods.affpcl import IFCA, IL, AffPCL, Ditto, FineTune, GaussianSystems, OneStepFedAvg, PFedMe, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the per-agent reference loops live in tests/
from tests.methods.affpcl.reference import reference_affpcl, reference_fedavg, reference_il  # noqa: E402

LEVELS, RUNS, N, STEPS, ALPHA = (0.0, 0.05, 0.3, 0.8), 10, 20, 60, 0.01
METHODS = {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(), "finetune": FineTune(), "pfedme": PFedMe(),
           "ditto": Ditto(), "ifca": IFCA()}
SHARED = {"il": reference_il, "fedavg": reference_fedavg, "affpcl": reference_affpcl}


def figure(methods: dict) -> None:
    """Every method at every level on fresh instances, as the experiment does."""
    for level in LEVELS:
        system = GaussianSystems(np.random.default_rng(0), RUNS, N, delta_env=level, delta_obj=level)
        for f in methods.values():
            f(system, STEPS, ALPHA, np.random.default_rng(1))


def vectorised(names) -> dict:
    return {m: (lambda *args, method=METHODS[m]: run(method, *args)) for m in names}


def main() -> None:
    times = compare({"full figure, vectorised (7 methods)": lambda: figure(vectorised(METHODS)),
                     "IL + FedAvg + AffPCL, vectorised": lambda: figure(vectorised(SHARED)),
                     "IL + FedAvg + AffPCL, per-agent loops": lambda: figure(SHARED)}, rounds=3, warmup=1)
    print(f"Fig. 1: {len(LEVELS)} levels x {RUNS} runs, n = {N}, T = {STEPS} (median of 3, interleaved)")
    for name, t in times.items():
        print(f"{name:>40}: {t:8.3f} s")
    ratio = times["IL + FedAvg + AffPCL, per-agent loops"] / times["IL + FedAvg + AffPCL, vectorised"]
    print(f"per-agent loops / vectorised on the shared methods: {ratio:.0f}x")
    print(f"whole figure under 10 s: {times['full figure, vectorised (7 methods)'] < 10}")


if __name__ == "__main__":
    main()
