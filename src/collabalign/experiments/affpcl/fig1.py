"""Fig. 1 of AffPCL (spec §8.2) on the Gaussian linear systems at both heterogeneity sets the paper states (main text
and App. B): every method's MSE^0 per step, means and medians over runs, and the figure's claims.

Replicates are runs: a fresh instance per run, shared by every method (each with its own sample noise, §9 item 21),
so methods are paired by run; MSE comparisons are per-run ratios of the last-10 MSE^0 (log scale, claims.py).
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Grid, Probability, Strict
from collabalign.experiments.affpcl import plots
from collabalign.experiments.affpcl.shared import LOWER, MATCH, bands, summary
from collabalign.methods.affpcl import (
    IFCA,
    IL,
    AffPCL,
    Ditto,
    FineTune,
    GaussianSystems,
    OneStepFedAvg,
    PFedMe,
    heterogeneity,
    run,
)
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

# "matches" is one-sided in the paper ("never worse"): MATCH's margin (factor 1.5); "significant speed-up" keeps the
# old threshold 2x as the smallest effect of interest.
HOMOGENEOUS = claims.non_inferiority(
    "AffPCL matches FedAvg in the homogeneous setting",
    "per-run last-10 MSE^0 ratio AffPCL / FedAvg at delta = 0 not above 1.5 (one-sided: AffPCL keeps FedAvg's "
    "linear speed-up)", **MATCH)
MATCHES_IL = claims.non_inferiority(
    "AffPCL matches independent learning at the highest heterogeneity",
    "never worse than IL: per-run last-10 MSE^0 ratio AffPCL / IL not above 1.5 at the set's highest level", **MATCH)
LOWEST = claims.non_inferiority(
    "AffPCL has the lowest last-10 MSE^0 at every level",
    "best or tied in every (level, rival) cell: per-run ratio AffPCL / rival not above 1.5, Holm over the cells",
    **MATCH)
CENTRE = claims.superiority(
    "At the highest level the agent closest to the centre still gets a significant speed-up",
    "agent 1's last-10 MSE lower with AffPCL than with IL (per-run ratio below 1); not reproduced when the speed-up "
    "is surely below 2x", smallest_effect=1.0, **LOWER)

LABELS = {"il": "independent", "fedavg": "FedAvg", "affpcl": "AffPCL", "finetune": "fine-tuning",
          "pfedme": "pFedMe (simplified)", "ditto": "Ditto", "ifca": "IFCA (exact assignment)",
          "affpcl_agent1": "AffPCL, agent 1 (centre)"}


class Fig1Config(Strict):
    n: PositiveInt = 20
    d: PositiveInt = 5
    runs: PositiveInt = 10
    steps: PositiveInt = 60
    alpha: PositiveFloat = 0.01
    sets: Annotated[dict[str, Grid[NonNegativeFloat]], Field(min_length=1)] = {"main_text": [0.0, 0.05, 0.3, 0.8],
                                                                          "appendix_b": [0.0, 0.05, 0.2, 0.5]}
    pretrain_ratio: Probability = 0.5
    reg: PositiveFloat = 15.0
    clusters: PositiveInt = 10
    ledger_level: NonNegativeFloat = 0.3  # run 0 at this level also goes through the federated simulator (Remark 1)


def methods(cfg: Fig1Config) -> dict:
    """Fig. 1's seven methods, in the paper's legend order."""
    return {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(), "finetune": FineTune(cfg.pretrain_ratio),
            "pfedme": PFedMe(cfg.reg), "ditto": Ditto(cfg.reg), "ifca": IFCA(cfg.clusters)}


def system(cfg: Fig1Config, seeds: Seeds, level: float) -> GaussianSystems:
    """The runs' instances at delta_env = delta_obj = level."""
    return GaussianSystems(seeds.numpy(f"fig1/{level}/instance"), cfg.runs, cfg.n, cfg.d, level, level)


def run_level(cfg: Fig1Config, seeds: Seeds, level: float) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Errors (T, R, n) of every method at one level, and the realised heterogeneity."""
    instance = system(cfg, seeds, level)
    errs = {m: run(method, instance, cfg.steps, cfg.alpha, seeds.numpy(f"fig1/{level}/{m}"))[0]
            for m, method in methods(cfg).items()}
    het = heterogeneity(instance, seeds.numpy(f"fig1/{level}/diagnostics"))
    return errs, {"delta_env_tv": float(het["delta_env_tv"].mean()), "delta_obj": float(het["delta_obj"].mean()),
                  "delta_cen_agent1": float(het["delta_cen_i"][:, 0].mean()),
                  "delta_cen_mean": float(het["delta_cen_i"].mean())}


def part(cfg: Fig1Config, seeds: Seeds, run_dir: RunDir, progress: bool = True) -> Part:
    """Fig. 1 at every level of both sets: records, plots and claims."""
    levels = sorted({lv for lvs in cfg.sets.values() for lv in lvs})
    errs, realised = {}, {}
    for level in levels:
        errs[level], realised[level] = run_level(cfg, seeds, level)
        if progress:
            print(f"affpcl fig1: level {level:g} done", flush=True)
    records, curves, last = fig1_records(errs, seeds)
    for name, lvs in cfg.sets.items():
        plots.fig1(run_dir.path / "plots" / f"fig1_{name}.png", lvs, curves, LABELS,
                   f"Fig. 1 ({name}): n = {cfg.n}, {cfg.runs} runs, alpha = {cfg.alpha}")
    out = [matches(HOMOGENEOUS, last[0.0], "fedavg")] if 0.0 in last else [claims.not_run(HOMOGENEOUS, "no level 0")]
    for name, lvs in cfg.sets.items():
        out += set_claims(cfg, name, lvs, last)
    metrics = {"fig1_last10_mse0": {f"{lv:g}": {m: summary(v) for m, v in last[lv].items()} for lv in levels},
               "fig1_realised_heterogeneity": {f"{lv:g}": realised[lv] for lv in levels}}
    note = (f"Gaussian linear systems of §5.1 (n = {cfg.n}, d = {cfg.d}, eps_A = 1, eps_b = 0.5, theta_base unit "
            f"norm), exact closed-form references, a fresh instance per run; constant step {cfg.alpha}, T = "
            f"{cfg.steps}, {cfg.runs} runs. AffPCL: COE + CDL (22-1) + exact density ratios. Levels are the knob "
            "delta_env = delta_obj; the realised TV-based delta_env is in the metrics (§9 item 8). 'Last-10 MSE^0' "
            "is the per-run mean over the last 10 steps of the agent-averaged MSE; methods are compared by per-run "
            "ratios, paired over runs.")
    return Part(claims=out, records=records, metrics=metrics, notes=[note])


def fig1_records(errs: dict, seeds: Seeds) -> tuple[list[dict], dict, dict]:
    """Per-step records (mean and median MSE^0 per method), banded curves for the plots and last-10 MSE per run."""
    records, curves, last = [], {}, {}
    for level, by_method in errs.items():
        series = {m: e.mean(2) for m, e in by_method.items()}
        series["affpcl_agent1"] = by_method["affpcl"][:, :, 0]
        curves[level] = {m: bands(s, seeds.numpy(f"bands/{level}/{m}")) for m, s in series.items()}
        last[level] = {m: s[-10:].mean(0) for m, s in series.items()}
        last[level]["il_agent1"] = by_method["il"][-10:, :, 0].mean(0)
        for m, b in curves[level].items():
            records += [{"figure": "fig1", "level": level, "method": m, "round": t + 1,
                         "mse0_mean": float(b["mean"][t]), "mse0_median": float(b["median"][t])}
                        for t in range(len(b["mean"]))]
    return records, curves, last


def matches(claim: claims.Claim, last: dict[str, np.ndarray], rival: str) -> dict:
    """AffPCL against one rival at one level, per-run last-10 MSE^0."""
    return claim.decide(last["affpcl"], last[rival], affpcl=summary(last["affpcl"]), **{rival: summary(last[rival])})


def set_claims(cfg: Fig1Config, name: str, levels: list[float], last: dict) -> list[dict]:
    """One heterogeneity set: matches IL at the top level, lowest at every level, the centre agent's speed-up."""
    top = max(levels)
    rivals = [m for m in methods(cfg) if m != "affpcl"]
    cells = {f"{lv:g}/{m}": (last[lv]["affpcl"], last[lv][m]) for lv in levels for m in rivals}
    centre = tagged(CENTRE, name, f"({top:g})").decide(
        last[top]["affpcl_agent1"], last[top]["il_agent1"], affpcl_agent1=summary(last[top]["affpcl_agent1"]),
        il_agent1=summary(last[top]["il_agent1"]))
    return [matches(tagged(MATCHES_IL, name, f"({top:g})"), last[top], "il"),
            tagged(LOWEST, name).decide_cells(cells), centre]
