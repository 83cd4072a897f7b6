"""E2–E5, the ablations (Figs. 3, 4, 7, 8, 9) on the synthetic problem, every run over all seeds: E2 equal upload
budget, with the federation's devices and again with `many_devices` (the paper's N = 50, Figs. 8, 9); E3 sketching
ratio at fixed r; E4 global rank at fixed k, rounds scaled by r/k so that every column of the global rank gets the
same expected number of updates; E5 top-k upload compression + sketching. E3–E5 are also reported against the
uploaded MB per device (a table in the notes and a plot each): a final score alone hides what each level paid."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from collabalign.claims import Claim, not_run, slopes, superiority
from collabalign.experiments.fslora.config import AblationConfig, Config, FederationConfig
from collabalign.experiments.fslora.plots import plot_ablations
from collabalign.experiments.fslora.runner import (
    Arm,
    Runner,
    devices,
    run_cache,
    score,
    synthetic_fingerprint,
    synthetic_problem,
)
from collabalign.experiments.fslora.scores import mean_std
from collabalign.runs import Part

EQUAL_BUDGET = superiority(
    "Under an equal upload budget, sketching beats no sketching at every global rank",
    "E2: FSLoRA at the budget ratio with 1/ratio times the rounds scores above FedLoRA (ratio 1), paired by seed, "
    "at every global rank of the budget grid (Holm over the ranks); smallest effect 0 (the paper: better at every "
    "rank, no size stated)")
EQUAL_BUDGET_MANY = superiority(
    "With 50 devices, sketching beats no sketching at equal upload budget at every global rank",
    "E2 with ablations.many_devices devices (50, the paper's Figs. 8, 9) and otherwise the federation's settings: "
    "FSLoRA at the budget ratio with 1/ratio times the rounds scores above FedLoRA (ratio 1), paired by seed, at "
    "every rank of many_devices_ranks (Holm over the ranks); smallest effect 0 (the paper: the advantage persists "
    "on every task, no size stated)")
RATIO_TREND = superiority(
    "At fixed r and rounds, a smaller sketching ratio is (slightly) worse",
    "E3: the slope of the final score (points) against log(k/r), fitted per seed over the ratio grid, above 0")
RANK_TREND = superiority(
    "At fixed device rank k, a larger global rank r helps",
    "E4: at device rank k = fixed_k, with rounds scaling with r/k (rounds = federation.rounds * r/k: every column of "
    "the global rank gets the same expected number of updates; rank_rounds_scale false: federation.rounds at every "
    "r), the slope of the final score (points) against log r, fitted per seed over the rank grid, above 0")
TOPK_RATIO_TREND = superiority(
    "With top-k upload compression, lower sketching ratios do better at equal upload",
    "E5: with top-k on the upload and rounds = top_k_rounds / ratio (equal uploaded MB per device), the slope of the "
    "final score (points) against log(k/r), fitted per seed, below 0", lower_is_better=True)
CLAIMS = (EQUAL_BUDGET, EQUAL_BUDGET_MANY, RATIO_TREND, RANK_TREND, TOPK_RATIO_TREND)


@dataclass
class Sweep:
    """One ablation's FSLoRA arms by level (a sketching ratio or a global rank), each run over all seeds."""

    experiment: str
    title: str
    level: str  # what the levels are: "ratio" or "r"
    arms: dict[float, Arm]
    scores: dict[float, np.ndarray] = field(default_factory=dict)  # final score (points), one per seed
    upload_mb: dict[float, np.ndarray] = field(default_factory=dict)  # uploaded MB per device at the end, per seed

    def run(self, cfg: Config, runner: Runner) -> Sweep:
        """Runs every arm over all seeds, keeping its final scores and uploads."""
        for x, arm in self.arms.items():
            tag = {"experiment": self.experiment, "variant": self.variant(x)}
            self.scores[x], self.upload_mb[x] = run_arm(cfg, runner, tag, arm)
        return self

    def variant(self, x: float) -> str:
        return f"{self.level}={x}"

    def means(self) -> dict[float, float]:
        return {x: float(s.mean()) for x, s in self.scores.items()}

    def metrics(self) -> dict[str, dict]:
        """Per level: mean final score, rounds and uploaded MB per device (mean over seeds)."""
        return {self.variant(x): {"score": round(float(self.scores[x].mean()), 2), "rounds": self.arms[x].rounds,
                                  "upload_mb_per_device": float(f"{self.upload_mb[x].mean():.4g}")}
                for x in sorted(self.arms)}

    def table(self) -> str:
        """Markdown: one row per level with its rounds, uploaded MB per device and final score over seeds."""
        lines = [f"{self.experiment}, {self.title}: final score against upload (uploaded MB per device at the end, "
                 "mean over seeds; score mean ± std over seeds):", "",
                 f"| {self.level} | rounds | uploaded MB per device | score (points) |", "|---|---|---|---|"]
        lines += [f"| {x} | {self.arms[x].rounds} | {self.upload_mb[x].mean():.4g} | "
                  "{:.2f} ± {:.2f} |".format(*mean_std(self.scores[x])) for x in sorted(self.arms)]
        return "\n".join(lines)


def ablations_part(cfg: Config, run_path: Path, progress: bool = True) -> Part:
    """Runs E2–E5 (each run saved in the synthetic runs' cache), plots them, tabulates E3–E5 against upload and
    decides the claims on per-seed final scores."""
    fed, abl, plots = cfg.federation, cfg.ablations, run_path / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    runner = Runner(fed, cfg.engine, progress, cache=run_cache(run_path, "synthetic"), key=synthetic_fingerprint(cfg))
    e2 = {"E2": equal_budget(cfg, runner, abl.budget_ranks)}
    if abl.many_devices is not None:
        many = runner.variant(devices=abl.many_devices)
        e2["E2_many_devices"] = equal_budget(cfg, many, abl.many_devices_ranks, f"N={abl.many_devices} ")
    e3, e4, e5 = (sweep.run(cfg, runner) for sweep in sweeps(fed, abl))
    e2_means = {name: mean_points(by_rank) for name, by_rank in e2.items()}
    plot_ablations(e2_means | {"E3": e3.means(), "E4": e4.means()}, runner.records, plots, abl.many_devices)
    claims = [
        equal_budget_claim(EQUAL_BUDGET, e2["E2"], budget_ratio=abl.budget_ratio),
        equal_budget_claim(EQUAL_BUDGET_MANY, e2["E2_many_devices"], devices=abl.many_devices,
                           budget_ratio=abl.budget_ratio) if "E2_many_devices" in e2
        else not_run(EQUAL_BUDGET_MANY, "ablations.many_devices is null"),
        trend(RATIO_TREND, e3.scores, score_by_ratio=e3.means()),
        trend(RANK_TREND, e4.scores, fixed_k=abl.fixed_k, rank_rounds_scale=abl.rank_rounds_scale,
              rounds_by_r={r: arm.rounds for r, arm in e4.arms.items()}, score_by_r=e4.means()),
        trend(TOPK_RATIO_TREND, e5.scores, top_k=abl.top_k, score_by_ratio=e5.means()),
    ]
    metrics = {"ablations": e2_means | {sweep.experiment: sweep.metrics() for sweep in (e3, e4, e5)}}
    return Part(claims, runner.records, metrics, [sweep.table() for sweep in (e3, e4, e5)])


def run_arm(cfg: Config, runner: Runner, tag: dict, arm: Arm) -> tuple[np.ndarray, np.ndarray]:
    """The arm on the synthetic problem under the runner's federation, over all seeds: final scores (points) and
    uploaded MB per device at the end, one per seed."""
    fed, scores, upload = runner.fed, [], []
    for seed in cfg.seeds:
        problem, train = synthetic_problem(cfg.synthetic, fed, seed, arm.rank, cfg.synthetic.lr)
        scores.append(score(runner.run(tag, problem, devices(train, fed, seed), arm, seed)))
        upload.append(runner.records[-1]["upload_mb_per_device"])  # the run's final round
    return np.array(scores), np.array(upload)


def equal_budget(cfg: Config, runner: Runner, ranks: list[int], prefix: str = "") -> dict[int, dict[str, np.ndarray]]:
    """E2 at each global rank under the runner's federation: final scores per seed of FedLoRA (ratio 1) for T
    rounds ("unsketched") and of FSLoRA at the budget ratio for T / ratio rounds ("sketched")."""
    q, t = cfg.ablations.budget_ratio, runner.fed.rounds
    return {r: {"unsketched": run_arm(cfg, runner, {"experiment": "E2", "variant": f"{prefix}r={r} unsketched"},
                                      Arm("fedlora", r, [1.0], t))[0],
                "sketched": run_arm(cfg, runner, {"experiment": "E2", "variant": f"{prefix}r={r} ratio={q}"},
                                    Arm("fslora", r, [q], round(t / q)))[0]} for r in ranks}


def sweeps(fed: FederationConfig, abl: AblationConfig) -> tuple[Sweep, Sweep, Sweep]:
    """E3, E4 and E5, not run yet. E4 runs each global rank r at device rank fixed_k for federation.rounds * r /
    fixed_k rounds, so that every column of the global rank gets the same expected number of updates (unscaled:
    federation.rounds)."""
    e3 = Sweep("E3", f"sketching ratio at r = {fed.rank}, {fed.rounds} rounds", "ratio",
               {q: Arm("fslora", fed.rank, [q], fed.rounds) for q in abl.ratio_grid})
    scale = {r: r / abl.fixed_k if abl.rank_rounds_scale else 1 for r in abl.rank_grid}
    e4 = Sweep("E4", f"global rank at device rank k = {abl.fixed_k}, rounds "
               + ("scaled by r/k" if abl.rank_rounds_scale else "equal"), "r",
               {r: Arm("fslora", r, [abl.fixed_k / r], round(fed.rounds * s)) for r, s in scale.items()})
    e5 = Sweep("E5", f"top-k {abl.top_k} on the upload, sketching ratio at r = {fed.rank}, {abl.top_k_rounds} / ratio "
               "rounds (equal upload)", "ratio",
               {q: Arm("fslora", fed.rank, [q], round(abl.top_k_rounds / q), abl.top_k) for q in abl.ratio_grid})
    return e3, e4, e5


def equal_budget_claim(claim: Claim, e2: dict[int, dict[str, np.ndarray]], **measured) -> dict:
    """The claim at every rank (Holm): sketched above unsketched, paired by seed."""
    return claim.decide_cells({f"r={r}": (arms["sketched"], arms["unsketched"]) for r, arms in e2.items()},
                              **measured, mean_points=mean_points(e2))


def trend(claim: Claim, by_level: dict[float, np.ndarray], **measured) -> dict:
    """The claim on the slope of score against log level, one fit per seed, against 0."""
    levels = sorted(by_level)
    if len(levels) < 2:
        return not_run(claim, f"a slope needs at least 2 levels, the grid has {len(levels)}")
    per_seed = np.stack([by_level[x] for x in levels], axis=1)  # (seeds, levels)
    return claim.decide(slopes(levels, per_seed, log_y=False), 0.0, **measured)


def mean_points(e2: dict[int, dict[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """E2's mean final score over seeds per rank and arm, to 2 decimals."""
    return {f"r={r}": {arm: round(float(s.mean()), 2) for arm, s in arms.items()} for r, arms in e2.items()}
