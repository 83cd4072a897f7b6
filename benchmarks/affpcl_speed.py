"""Run time of the whole Fig. 1 of AffPCL (7 methods x 4 levels x 10 runs, n = 20, T = 60), vectorised over runs and
agents, and its ratio to the per-agent reference loops on the methods both implement (IL, FedAvg, AffPCL), measured
interleaved in one run. Goal: the whole figure in under 10 s.
Run: OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/affpcl_speed.py
"""

from __future__ import annotations

import numpy as np
from timing import compare

from collabalign.methods.affpcl import METHODS, GaussianSystems
from collabalign.methods.affpcl.reference import reference_affpcl, reference_fedavg, reference_il

LEVELS, RUNS, N, STEPS, ALPHA = (0.0, 0.05, 0.3, 0.8), 10, 20, 60, 0.01
SHARED = {"il": reference_il, "fedavg": reference_fedavg, "affpcl": reference_affpcl}


def figure(methods: dict) -> None:
    """Every method at every level on fresh instances, as the experiment does."""
    for level in LEVELS:
        system = GaussianSystems(np.random.default_rng(0), RUNS, N, delta_env=level, delta_obj=level)
        for f in methods.values():
            f(system, STEPS, ALPHA, np.random.default_rng(1))


def main() -> None:
    fast_shared = {m: METHODS[m] for m in SHARED}
    times = compare({"full figure, vectorised (7 methods)": lambda: figure(METHODS),
                     "IL + FedAvg + AffPCL, vectorised": lambda: figure(fast_shared),
                     "IL + FedAvg + AffPCL, per-agent loops": lambda: figure(SHARED)}, rounds=3, warmup=1)
    print(f"Fig. 1: {len(LEVELS)} levels x {RUNS} runs, n = {N}, T = {STEPS} (median of 3, interleaved)")
    for name, t in times.items():
        print(f"{name:>40}: {t:8.3f} s")
    ratio = times["IL + FedAvg + AffPCL, per-agent loops"] / times["IL + FedAvg + AffPCL, vectorised"]
    print(f"per-agent loops / vectorised on the shared methods: {ratio:.0f}x")
    print(f"whole figure under 10 s: {times['full figure, vectorised (7 methods)'] < 10}")


if __name__ == "__main__":
    main()
