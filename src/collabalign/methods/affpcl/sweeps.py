"""The exhaustive sweeps of Fig. 4 (improvement of AffPCL over IL and FedAvg on a (delta_env, delta_obj) grid) and
Fig. 5 (AffPCL's MSE on an (n, delta) grid). One vectorised run per cell; cells differ in their system's shape."""

from __future__ import annotations

import numpy as np

from collabalign.methods.affpcl.algorithm import run_affpcl
from collabalign.methods.affpcl.baselines import run_fedavg, run_il
from collabalign.methods.affpcl.stats import last_mse
from collabalign.methods.affpcl.systems import GaussianSystems
from collabalign.seeding import Seeds

FIG4 = {"il": run_il, "fedavg": run_fedavg, "affpcl": run_affpcl}


def improvement(base: np.ndarray, affpcl: np.ndarray) -> np.ndarray:
    """Percent reduction of the run-mean last-10 MSE^0; NaN where AffPCL is worse than twice the base (§9 item 12)."""
    out = 100 * (base - affpcl) / base
    return np.where(affpcl > 2 * base, np.nan, out)


def fig4_grid(seeds: Seeds, env: list[float], obj: list[float], n: int, runs: int, steps: int,
              alpha: float) -> dict[str, np.ndarray]:
    """Run-mean last-10 MSE^0 of IL, FedAvg and AffPCL per cell, arrays (len(env), len(obj)), and the improvements."""
    mse = {m: np.empty((len(env), len(obj))) for m in FIG4}
    for a, de in enumerate(env):
        for b, do in enumerate(obj):
            system = GaussianSystems(seeds.numpy(f"fig4/{de}/{do}/instance"), runs, n, delta_env=de, delta_obj=do)
            for m, f in FIG4.items():
                mse[m][a, b] = last_mse(f(system, steps, alpha, seeds.numpy(f"fig4/{de}/{do}/{m}"))).mean()
    return {**mse, "vs_il": improvement(mse["il"], mse["affpcl"]),
            "vs_fedavg": improvement(mse["fedavg"], mse["affpcl"])}


def fig5_grid(seeds: Seeds, n_list: list[int], deltas: list[float], runs: int, steps: int,
              alpha: float) -> np.ndarray:
    """Run-mean last-10 MSE^0 of AffPCL per (n, delta = delta_env = delta_obj) cell, (len(n_list), len(deltas))."""
    out = np.empty((len(n_list), len(deltas)))
    for a, n in enumerate(n_list):
        for b, delta in enumerate(deltas):
            system = GaussianSystems(seeds.numpy(f"fig5/{n}/{delta}/instance"), runs, n, delta_env=delta,
                                     delta_obj=delta)
            out[a, b] = last_mse(run_affpcl(system, steps, alpha, seeds.numpy(f"fig5/{n}/{delta}/affpcl"))).mean()
    return out


def r_squared(x: np.ndarray, y: np.ndarray) -> float:
    """Share of the variance of y explained by a least-squares line in x."""
    coef = np.polyfit(x, y, 1)
    resid = y - np.polyval(coef, x)
    return float(1 - resid.var() / y.var())
