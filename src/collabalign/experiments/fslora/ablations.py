"""E2–E5, the ablations (Figs. 3, 4, 7) on the synthetic problem, every run over all seeds: E2 equal upload
budget, E3 sketching ratio at fixed r, E4 global rank at fixed k, E5 top-k upload compression + sketching."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.claims import Claim, not_run, slopes, superiority
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.plots import plot_ablations
from collabalign.experiments.fslora.runner import Arm, Runner, devices, score, synthetic_problem
from collabalign.runs import Part

EQUAL_BUDGET = superiority(
    "Under an equal upload budget, sketching beats no sketching at every global rank",
    "E2: FSLoRA at the budget ratio with 1/ratio times the rounds scores above FedLoRA (ratio 1), paired by seed, "
    "at every global rank of the budget grid (Holm over the ranks); smallest effect 0 (the paper: better at every "
    "rank, no size stated)")
RATIO_TREND = superiority(
    "At fixed r and rounds, a smaller sketching ratio is (slightly) worse",
    "E3: the slope of the final score (points) against log(k/r), fitted per seed over the ratio grid, above 0")
RANK_TREND = superiority(
    "At fixed device rank k, a larger global rank r helps",
    "E4: the slope of the final score (points) against log r at fixed k, fitted per seed over the rank grid, above 0")
TOPK_RATIO_TREND = superiority(
    "With top-k upload compression, lower sketching ratios do better at equal upload",
    "E5: with top-k on the upload and rounds = top_k_rounds / ratio (equal uploaded MB per device), the slope of the "
    "final score (points) against log(k/r), fitted per seed, below 0", lower_is_better=True)
CLAIMS = (EQUAL_BUDGET, RATIO_TREND, RANK_TREND, TOPK_RATIO_TREND)


def ablations_part(cfg: Config, plots: Path, progress: bool = True) -> Part:
    """Runs E2–E5, plots them and decides their claims on per-seed final scores."""
    fed, abl = cfg.federation, cfg.ablations
    runner = Runner(fed, progress)

    def scores(experiment: str, variant: str, arm: Arm) -> np.ndarray:
        """The arm's final score on the synthetic problem, one per seed."""
        tag, out = {"experiment": experiment, "variant": variant}, []
        for seed in cfg.seeds:
            problem, train = synthetic_problem(cfg.synthetic, fed, seed, arm.rank, cfg.synthetic.lr)
            out.append(score(runner.run(tag, problem, devices(train, fed, seed), arm, seed)))
        return np.array(out)

    e2 = {r: {"unsketched": scores("E2", f"r={r} unsketched", Arm("fedlora", r, [1.0], fed.rounds)),
              "sketched": scores("E2", f"r={r} ratio={abl.budget_ratio}",
                                 Arm("fslora", r, [abl.budget_ratio], round(fed.rounds / abl.budget_ratio)))}
          for r in abl.budget_ranks}
    e3 = {q: scores("E3", f"ratio={q}", Arm("fslora", fed.rank, [q], fed.rounds)) for q in abl.ratio_grid}
    e4 = {r: scores("E4", f"r={r}", Arm("fslora", r, [abl.fixed_k / r], fed.rounds)) for r in abl.rank_grid}
    e5 = {q: scores("E5", f"ratio={q} top-k={abl.top_k}",
                    Arm("fslora", fed.rank, [q], round(abl.top_k_rounds / q), abl.top_k)) for q in abl.ratio_grid}
    means = {"E2": {f"r={r}": mean_over_seeds(arms) for r, arms in e2.items()}, "E3": mean_over_seeds(e3),
             "E4": mean_over_seeds(e4), "E5": mean_over_seeds(e5)}
    plot_ablations(means, runner.records, plots)
    claims = [
        EQUAL_BUDGET.decide_cells({f"r={r}": (arms["sketched"], arms["unsketched"]) for r, arms in e2.items()},
                                  budget_ratio=abl.budget_ratio, mean_points=means["E2"]),
        trend(RATIO_TREND, e3, score_by_ratio=means["E3"]),
        trend(RANK_TREND, e4, fixed_k=abl.fixed_k, score_by_r=means["E4"]),
        trend(TOPK_RATIO_TREND, e5, top_k=abl.top_k, score_by_ratio=means["E5"]),
    ]
    metrics = {"ablations": {name: {str(x): _rounded(v) for x, v in by.items()} for name, by in means.items()}}
    return Part(claims, runner.records, metrics)


def trend(claim: Claim, by_level: dict[float, np.ndarray], **measured) -> dict:
    """The claim on the slope of score against log level, one fit per seed, against 0."""
    levels = sorted(by_level)
    if len(levels) < 2:
        return not_run(claim, f"a slope needs at least 2 levels, the grid has {len(levels)}")
    per_seed = np.stack([by_level[x] for x in levels], axis=1)  # (seeds, levels)
    return claim.decide(slopes(levels, per_seed, log_y=False), 0.0, **measured)


def mean_over_seeds(scores: dict) -> dict:
    return {key: float(per_seed.mean()) for key, per_seed in scores.items()}


def _rounded(value: float | dict) -> float | dict:
    return {k: round(v, 2) for k, v in value.items()} if isinstance(value, dict) else round(value, 2)

