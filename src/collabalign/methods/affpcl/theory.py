"""Numerical checks of the AffPCL theory (spec §7.2 items 2, 3 and 5) on the Gaussian systems: the MSE rate in t, the
speed-up over independent learning against max{1/n, delta}, and the agent-specific speed-up (Fig. 6)."""

from __future__ import annotations

import numpy as np

from collabalign.fits import loglog_slope
from collabalign.methods.affpcl.algorithm import run_affpcl
from collabalign.methods.affpcl.baselines import run_il
from collabalign.methods.affpcl.common import theory_steps
from collabalign.methods.affpcl.stats import last_mse, spearman
from collabalign.methods.affpcl.systems import GaussianSystems, heterogeneity
from collabalign.seeding import Seeds

PAIR = {"il": run_il, "affpcl": run_affpcl}


def _pair(seeds: Seeds, tag: str, system: GaussianSystems, steps: int, alpha) -> dict[str, np.ndarray]:
    """IL and AffPCL errors on one system, each with its own noise stream."""
    return {m: f(system, steps, alpha, seeds.numpy(f"{tag}/{m}")) for m, f in PAIR.items()}


def rate_check(seeds: Seeds, n: int, levels: list[float], steps: int, runs: int, c: float = 2.0) -> dict:
    """Slope of log MSE^0 (mean over runs) against log t over t in [T/4, T], steps c / (lambda (t + t0)) (§3.10)."""
    t = np.arange(1, steps + 1)
    fit = t >= steps // 4
    grid = np.unique(np.geomspace(1, steps, 60).astype(int)) - 1
    out: dict = {"slopes": {}, "curves": {}, "t": (grid + 1).tolist(), "fit_from": int(steps // 4)}
    for level in levels:
        system = GaussianSystems(seeds.numpy(f"rate/{level}/instance"), runs, n, delta_env=level, delta_obj=level)
        errs = _pair(seeds, f"rate/{level}", system, steps, theory_steps(system, steps, c))
        curves = {m: e.mean((1, 2)) for m, e in errs.items()}
        out["slopes"][level] = {m: loglog_slope(t[fit], cur[fit])[0] for m, cur in curves.items()}
        out["curves"][level] = {m: cur[grid].tolist() for m, cur in curves.items()}
    return out


def speedup_check(seeds: Seeds, n_list: list[int], deltas: list[float], delta_n: int, steps: int,
                  runs: int) -> dict:
    """r = MSE^0_AffPCL / MSE^0_IL (last tenth of T, means over runs) at constant steps ln T / (lambda T), over n at
    delta = 0 and over delta_env = delta_obj = delta at n = delta_n; slope of log r against log max{1/n, delta}."""
    points = [(n, 0.0) for n in n_list] + [(delta_n, d) for d in deltas if d > 0]
    rows = []
    for n, delta in points:
        system = GaussianSystems(seeds.numpy(f"speedup/{n}/{delta}/instance"), runs, n, delta_env=delta,
                                 delta_obj=delta)
        errs = _pair(seeds, f"speedup/{n}/{delta}", system, steps, np.log(steps) / (system.lam * steps))
        last = {m: last_mse(e, max(1, steps // 10)) for m, e in errs.items()}
        het = heterogeneity(system, seeds.numpy(f"speedup/{n}/{delta}/diagnostics"))
        rows.append({"n": n, "delta": delta, "x": max(1 / n, delta), "ratio": float(last["affpcl"].mean()
                                                                                  / last["il"].mean()),
                     "realised_delta": float(np.maximum(het["delta_env_tv"], het["delta_obj"]).mean())})
    x, r = np.array([p["x"] for p in rows]), np.array([p["ratio"] for p in rows])
    on_n = np.array([p["delta"] == 0 for p in rows])
    slope, intercept = loglog_slope(x, r)
    part = (lambda sel: loglog_slope(x[sel], r[sel])[0] if sel.sum() > 1 else None)
    return {"points": rows, "slope": slope, "constant": float(np.exp(intercept)), "slope_in_n": part(on_n),
            "slope_in_delta": part(~on_n)}


def agent_check(seeds: Seeds, n: int, level: float, steps: int, runs: int, alpha: float) -> dict:
    """Fig. 6: IL and AffPCL errors of agent 1 (centre) and a generic agent (the last), and the rank correlation of
    the per-(run, agent) ratio MSE_AffPCL / MSE_IL with max{1/n, delta_cen^i} (eq. 9)."""
    system = GaussianSystems(seeds.numpy(f"agent/{level}/instance"), runs, n, delta_env=level, delta_obj=level)
    errs = _pair(seeds, f"agent/{level}", system, steps, alpha)
    cen = heterogeneity(system, seeds.numpy(f"agent/{level}/diagnostics"))["delta_cen_i"]
    per = {m: e[-10:].mean(0) for m, e in errs.items()}  # (R, n)
    rho, p_value = spearman((per["affpcl"] / per["il"]).ravel(), np.maximum(1 / n, cen).ravel())
    by_agent = per["affpcl"].mean(0) / per["il"].mean(0)
    return {"errors": errs, "per_run": per, "spearman": rho, "spearman_p": p_value,
           "ratio_by_agent": by_agent,
            "delta_cen_agent1": float(cen[:, 0].mean()), "delta_cen_others": float(cen[:, 1:].mean())}

