"""Fig. 6 of AffPCL and the agent-specific rate (eq. 9, spec §7.2 item 5): at (delta_env, delta_obj) = (0.7, 0.7) the
agent closest to the centre (agent 1) gets a free ride while a generic agent (the last) performs like independent
learning, and the speed-up shrinks as delta_cen^i grows. Runs are the replicates (20, the reference scripts')."""

from __future__ import annotations

import numpy as np
from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Strict
from collabalign.experiments.affpcl import plots
from collabalign.experiments.affpcl.shared import LOWER, bands, summary
from collabalign.experiments.affpcl.theory import pair
from collabalign.methods.affpcl import GaussianSystems, heterogeneity
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

# The free ride keeps Fig. 1's "significant speed-up" threshold (2x) as its smallest effect; "performs similarly" is
# two-sided in the paper: equivalence within the old match band [2/3, 1.5] (margin 0.5 on the ratio scale).
FREE_RIDE = claims.superiority(
    "Fig. 6: the centre agent gets a free ride",
    "agent 1's last-10 MSE lower with AffPCL than with IL (per-run ratio below 1); not reproduced when the speed-up "
    "is surely below 2x", smallest_effect=1.0, **LOWER)
GENERIC = claims.equivalence(
    "Fig. 6: a generic agent performs similarly to independent learning",
    "the last agent's per-run last-10 MSE ratio AffPCL / IL inside [2/3, 1.5]", margin=0.5, scale="ratio")
AGENT_RATE = claims.superiority(
    "Agent-specific rate: the speed-up shrinks as delta_cen^i grows (eq. 9)",
    "per-run log-log slope of the agents' MSE ratio AffPCL / IL against max{1/n, delta_cen^i} above 0")


class Fig6Config(Strict):
    run: bool = True
    n: PositiveInt = 40  # Fig. 6 setting of the reference scripts
    level: NonNegativeFloat = 0.7
    steps: PositiveInt = 70
    runs: PositiveInt = 20
    alpha: PositiveFloat = 0.01


def part(cfg: Fig6Config, seeds: Seeds, run_dir: RunDir) -> Part:
    """IL and AffPCL per agent at one level: the two agents' panels, their claims and the trend over agents."""
    system = GaussianSystems(seeds.numpy(f"agent/{cfg.level}/instance"), cfg.runs, cfg.n, delta_env=cfg.level,
                             delta_obj=cfg.level)
    errs = pair(seeds, f"agent/{cfg.level}", system, cfg.steps, cfg.alpha)
    cen = heterogeneity(system, seeds.numpy(f"agent/{cfg.level}/diagnostics"))["delta_cen_i"]
    panels = {title: {m: bands(e[:, :, i], seeds.numpy(f"bands/agent/{m}/{i}")) for m, e in errs.items()}
              for title, i in ((f"generic agent (agent {cfg.n})", -1), ("agent 1 (closest to the centre)", 0))}
    plots.fig6(run_dir.path / "plots" / "fig6_agents.png", panels)
    per = {m: e[-10:].mean(0) for m, e in errs.items()}  # (R, n)
    ratio = per["affpcl"] / per["il"]
    by_agent = per["affpcl"].mean(0) / per["il"].mean(0)
    x = np.maximum(1 / cfg.n, cen)
    trend = claims.slopes(x, ratio)  # each run against its own agents' heterogeneity
    setting = f"at ({cfg.level:g}, {cfg.level:g})"
    decided = [
        tagged(FREE_RIDE, suffix=setting).decide(per["affpcl"][:, 0], per["il"][:, 0],
                                                 affpcl=summary(per["affpcl"][:, 0]), il=summary(per["il"][:, 0]),
                                                 agent1_rank_among_agents=int((by_agent < by_agent[0]).sum()) + 1),
        tagged(GENERIC, suffix=setting).decide(per["affpcl"][:, -1], per["il"][:, -1],
                                               median_agent_ratio=float(np.median(by_agent))),
        AGENT_RATE.decide(trend, 0.0, delta_cen_agent1=float(cen[:, 0].mean()),
                          delta_cen_others=float(cen[:, 1:].mean()))]
    metrics = {"fig6": {"ratio_by_agent": np.round(by_agent, 4).tolist(), "delta_cen_agent1": float(cen[:, 0].mean()),
                        "delta_cen_others": float(cen[:, 1:].mean())}}
    return Part(claims=decided, metrics=metrics)
