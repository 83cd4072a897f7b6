"""Numerical checks of the AffPCL theory (spec §7.2 items 2 and 3) on the Gaussian systems: the MSE rate in t with
diminishing steps, and the speed-up over independent learning against max{1/n, delta}. Slopes are fitted per run
(claims.slopes); runs are the replicates. Item 1 is a unit test, items 4 and 5 are Fig. 5 and Fig. 6's trend (sweeps.py,
fig6.py), items 6-9 are in checks.py."""

from __future__ import annotations

import numpy as np
from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Grid, Strict
from collabalign.experiments.affpcl import plots
from collabalign.experiments.affpcl.shared import MATCH, last_mse
from collabalign.fits import loglog_slope
from collabalign.methods.affpcl import IL, AffPCL, GaussianSystems, heterogeneity, run
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

# Bands are the old claims' declared bands: slope -1 +- 0.25 (rate 1/t), 1 +- 0.3 (speed-up ~ max{1/n, delta});
# "never worse" is one-sided with MATCH's margin, a factor 1.5 (reason in shared.py).
RATE = claims.in_band(
    "Theory: MSE decays like 1/t (fitted slope of log MSE^0 vs log t)",
    "AffPCL's per-run slope of log MSE^0 against log t over [T/4, T] in [-1.25, -0.75], steps c / (lambda (t + t0))",
    -1.25, -0.75)
SPEEDUP = claims.in_band(
    "Theory: speed-up over independent learning ~ max{1/n, delta}",
    "per-run log-log slope of the last-tenth MSE^0 ratio AffPCL / IL against max{1/n, delta} in [0.7, 1.3] (runs "
    "paired by index across the (n, delta) points)", 0.7, 1.3)
NEVER_WORSE = claims.non_inferiority(
    "Theory: AffPCL is never worse than independent learning",
    "per-run MSE^0 ratio AffPCL / IL not above 1.5 at every (n, delta) point, Holm over the points",
    **MATCH)
PAIR = {"il": IL(), "affpcl": AffPCL()}


class TheoryConfig(Strict):
    run: bool = True
    rate_n: PositiveInt = 20
    rate_levels: Grid[NonNegativeFloat] = [0.0, 0.2]
    rate_steps: PositiveInt = 2000
    rate_runs: PositiveInt = 6
    rate_c: PositiveFloat = 2.0
    speedup_n_list: Grid[PositiveInt] = [2, 5, 10, 20, 50]
    speedup_deltas: Grid[NonNegativeFloat] = [0.05, 0.2, 0.5, 0.8]
    speedup_n: PositiveInt = 50
    speedup_steps: PositiveInt = 2000
    speedup_runs: PositiveInt = 6


def theory_steps(system: GaussianSystems, steps: int, c: float = 2.0, alpha0: float = 0.01) -> np.ndarray:
    """Diminishing steps alpha_t = c / (lambda (t + t0)) per run, t0 chosen so that alpha_0 = alpha0 (§7.2 item 2)."""
    t0 = c / (alpha0 * system.lam)
    return c / (system.lam[None, :] * (np.arange(steps)[:, None] + t0[None, :]))


def pair(seeds: Seeds, tag: str, system: GaussianSystems, steps: int, alpha) -> dict[str, np.ndarray]:
    """IL and AffPCL errors (T, R, n) on one system, each with its own noise stream."""
    return {m: run(method, system, steps, alpha, seeds.numpy(f"{tag}/{m}"))[0] for m, method in PAIR.items()}


def part(cfg: TheoryConfig, seeds: Seeds, run_dir: RunDir) -> Part:
    """The rate and speed-up checks with their plots."""
    rate_claims, rate = rate_check(cfg, seeds)
    speed_claims, speed = speedup_check(cfg, seeds)
    plots.rate(run_dir.path / "plots" / "theory_rate.png", rate)
    plots.speedup(run_dir.path / "plots" / "theory_speedup.png", speed)
    metrics = {"rate": {"mean_slope": rate["slopes"], "fit_from_t": rate["fit_from"], "steps": cfg.rate_steps},
               "speedup": speed}
    return Part(claims=rate_claims + speed_claims, metrics={"theory": metrics})


def rate_check(cfg: TheoryConfig, seeds: Seeds) -> tuple[list[dict], dict]:
    """Per level: slopes of log MSE^0 against log t over t in [T/4, T] per run (§3.10), and the mean curves."""
    t = np.arange(1, cfg.rate_steps + 1)
    fit = t >= cfg.rate_steps // 4
    grid = np.unique(np.geomspace(1, cfg.rate_steps, 60).astype(int)) - 1
    out: dict = {"slopes": {}, "curves": {}, "t": (grid + 1).tolist(), "fit_from": int(cfg.rate_steps // 4)}
    decided = []
    for level in cfg.rate_levels:
        system = GaussianSystems(seeds.numpy(f"rate/{level}/instance"), cfg.rate_runs, cfg.rate_n, delta_env=level,
                                 delta_obj=level)
        errs = pair(seeds, f"rate/{level}", system, cfg.rate_steps, theory_steps(system, cfg.rate_steps, cfg.rate_c))
        per_run = {m: e.mean(2) for m, e in errs.items()}  # (T, R)
        slopes = {m: claims.slopes(t[fit], c[fit].T) for m, c in per_run.items()}
        out["slopes"][level] = {m: round(float(s.mean()), 3) for m, s in slopes.items()}
        out["curves"][level] = {m: c.mean(1)[grid].tolist() for m, c in per_run.items()}
        decided.append(tagged(RATE, suffix=f"at delta = {level:g}").decide(
            slopes["affpcl"], il_slope=float(slopes["il"].mean()), fit_over_t=f"[{out['fit_from']}, {cfg.rate_steps}]"))
    return decided, out


def speedup_check(cfg: TheoryConfig, seeds: Seeds) -> tuple[list[dict], dict]:
    """Last-tenth MSE^0 of IL and AffPCL per run at constant steps ln T / (lambda T), over n at delta = 0 and over
    delta_env = delta_obj = delta at n = speedup_n; per-run slopes of log ratio against log max{1/n, delta}."""
    points = [(n, 0.0) for n in cfg.speedup_n_list] + [(cfg.speedup_n, d) for d in cfg.speedup_deltas if d > 0]
    rows, last = [], {}
    for n, delta in points:
        system = GaussianSystems(seeds.numpy(f"speedup/{n}/{delta}/instance"), cfg.speedup_runs, n, delta_env=delta,
                                 delta_obj=delta)
        errs = pair(seeds, f"speedup/{n}/{delta}", system, cfg.speedup_steps,
                    np.log(cfg.speedup_steps) / (system.lam * cfg.speedup_steps))
        last[n, delta] = {m: last_mse(e, max(1, cfg.speedup_steps // 10)) for m, e in errs.items()}
        het = heterogeneity(system, seeds.numpy(f"speedup/{n}/{delta}/diagnostics"))
        rows.append({"n": n, "delta": delta, "x": max(1 / n, delta),
                     "ratio": float(last[n, delta]["affpcl"].mean() / last[n, delta]["il"].mean()),
                     "realised_delta": float(np.maximum(het["delta_env_tv"], het["delta_obj"]).mean())})
    x = np.array([p["x"] for p in rows])
    ratios = np.stack([last[p]["affpcl"] / last[p]["il"] for p in points], 1)  # (R, points)
    on_n = np.array([delta == 0 for _, delta in points])
    slope, intercept = loglog_slope(x, [p["ratio"] for p in rows])  # the plot's fit to the ratios of means
    cells = {f"n={n}, delta={delta:g}": (last[n, delta]["affpcl"], last[n, delta]["il"]) for n, delta in points}
    decided = [SPEEDUP.decide(claims.slopes(x, ratios), slope_n_sweep=_mean_slope(x, ratios, on_n),
                              slope_delta_sweep=_mean_slope(x, ratios, ~on_n)),
               NEVER_WORSE.decide_cells(cells)]
    return decided, {"points": rows, "slope": slope, "constant": float(np.exp(intercept))}


def _mean_slope(x: np.ndarray, ratios: np.ndarray, sel: np.ndarray) -> float | None:
    """Mean per-run slope over a subset of the points (context: the n sweep or the delta sweep alone)."""
    return float(claims.slopes(x[sel], ratios[:, sel]).mean()) if sel.sum() > 1 else None
