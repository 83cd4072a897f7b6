"""E1 on GLUE (Table 5.1) on a small encoder with LoRA on query/value of every block (dropout 0.1, as the paper).

Per task, each arm's learning rate and LoRA alpha are chosen from one grid on a held-out slice of the task's
training examples (the dev split it is scored on is never looked at), on the first seed. Then every arm runs over the
seeds and is scored on the dev split: first the references, centralised LoRA (one party holding every training
example, with the federation's total steps per round) and the frozen backbone with a trained head; chance is the
majority class of the training examples (STS-B: Pearson 0). A task is learned when centralised LoRA is above chance
and above the frozen head; the methods are ranked only on learned tasks, so with `glue.gate` the five federated
methods run only on a task whose own two cells confirm it (a task that cannot order them costs no method runs; the
claim over every task, Holm over all cells, is stricter, so every task it confirms has them). E2 runs on one GLUE
task when configured. A labelled-text JSONL (`glue.data`, labelled.py) runs as one more task, after the GLUE tasks.
Every run is cached in the run folder, so a long main run that stops continues where it stopped."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from collabalign.claims import not_run, superiority
from collabalign.data import shared_data_dir
from collabalign.data.formats import file_hash
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.labelled import jsonl_problem
from collabalign.experiments.fslora.runner import METHODS, Arm, Runner, devices, federation_settings, score
from collabalign.experiments.fslora.scores import E1Scores
from collabalign.federation.engine import RoundFailed
from collabalign.methods.fslora.glue import glue_problem
from collabalign.methods.fslora.problems import ClassificationData, TorchLoRAProblem
from collabalign.models.backbones import load_backbone
from collabalign.runs import fingerprint
from collabalign.seeding import Seeds
from collabalign.selection import best, held_out_slice

REFERENCES = ("centralised", "frozen")  # the upper reference and the floor every method is read against
ARMS = (*METHODS, *REFERENCES)
LEARNED = superiority(
    "Every GLUE task is learned: centralised LoRA scores above chance and above the frozen backbone with a trained "
    "head",
    "Per task, centralised LoRA's dev score above the majority-class score and above the frozen head's, paired by "
    "seed, Holm over every (task, floor) cell; smallest effect 0. Only tasks whose two cells are confirmed enter the "
    "ranking of the methods")
GLUE_EQUAL_BUDGET = superiority(
    "Under an equal upload budget, sketching beats no sketching on a GLUE task",
    "E2 on glue.budget_task: FSLoRA with every device at ratio ablations.budget_ratio for T / ratio rounds above "
    "FedLoRA (ratio 1, T rounds), global rank federation.rank, paired by seed; smallest effect 0 (the paper: better "
    "at every rank, Fig. 3)")


@dataclass
class GlueTask:
    """A GLUE task's problem and its rows: `fit` (what the arms train on), `select` (the held-out slice of the
    training examples the learning rate is chosen on) and `dev` (what the arms are scored on)."""

    name: str
    problem: TorchLoRAProblem
    fit: ClassificationData
    select: ClassificationData
    dev: ClassificationData

    @property
    def chance(self) -> float:
        """The dev score of always answering the training examples' majority class (STS-B: Pearson 0), in points."""
        if self.fit.y.is_floating_point():
            return 0.0
        majority = torch.bincount(self.fit.y).argmax()
        return 100 * float((self.dev.y == majority).double().mean())


def load_task(cfg: Config, task: str, backbone, runner: Runner) -> GlueTask:
    """The task's problem (a GLUE task, or the JSONL task `glue.data`); `select_fraction` of its training examples
    (seeded) held out for the grid choice."""
    setup = cfg.glue.setup(runner.fed, task)
    if cfg.glue.data is not None and task == cfg.glue.data.name:
        problem, train = jsonl_problem(cfg.glue.data, backbone, setup)
    else:
        shared = shared_data_dir()
        root = None if shared is None else shared / "glue"  # tasks without a folder there come from the hub
        problem, train = glue_problem(task, root, backbone, setup, Seeds(0))
    fit, select = held_out_slice(np.zeros(len(train)), cfg.glue.select_fraction, Seeds(0).numpy("glue-select", task))
    return GlueTask(task, problem, train[fit], train[select], problem.test)


@dataclass(frozen=True, order=True)
class Point:
    """A point of the GLUE grid: local step size and LoRA alpha (scale alpha / sqrt(r))."""

    lr: float
    alpha: float

    def __str__(self) -> str:
        return f"lr {self.lr:g}, alpha {self.alpha:g}"


def grid(cfg: Config) -> list[Point]:
    return [Point(lr, alpha) for alpha in cfg.glue.alpha_grid for lr in cfg.glue.lr_grid]


def arm_run(runner: Runner, task: GlueTask, arm: str, seed: int, point: Point, on: str, rounds: int | None = None,
            ratio: float | None = None):
    """One arm at a grid point, scored on the task's `on` rows ("select" or "dev"). Federated methods split the
    training rows over the devices; the references train one party on all of them, with the federation's total
    steps per round (frozen: the head only). `rounds`/`ratio` override the federation's (E2's sketched arm)."""
    runner = runner.variant(lora_alpha=point.alpha)
    fed, problem = runner.fed, task.problem
    problem.test = task.select if on == "select" else task.dev
    if arm in METHODS:
        problem.sgd = fed.local_sgd(point.lr)
        clients = devices(task.fit, fed, seed)
        spec = Arm(arm, fed.rank, fed.ratios if ratio is None else [ratio], rounds or fed.rounds)
    else:
        problem.sgd = replace(fed.local_sgd(point.lr), steps=fed.steps * fed.devices, lora=arm == "centralised")
        clients = {"everyone": task.fit}
        spec = Arm("fedlora", fed.rank, [1.0], fed.rounds, name=arm)
    tag = {"experiment": "E1" if ratio is None else "E2", "problem": task.name, "lr": point.lr,
           "lora_alpha": point.alpha, "scored_on": on}
    if ratio is not None:
        tag["variant"] = f"ratio={ratio} rounds={spec.rounds}"
    return runner.run(tag, problem, clients, spec, seed)


def choose(cfg: Config, runner: Runner, task: GlueTask, arms: tuple[str, ...]) -> dict[str, dict[Point, float]]:
    """Each arm at every grid point on the first seed, scored on the selection slice: arm -> {point: score}; a run
    that diverges (its round fails: every reply non-finite) scores NaN. A one-point grid needs no runs."""
    points = grid(cfg)
    if len(points) == 1:
        return {arm: {points[0]: float("nan")} for arm in arms}
    if cfg.glue.select_eval_every is not None:
        runner = runner.variant(eval_every=cfg.glue.select_eval_every)
    out: dict[str, dict[Point, float]] = {}
    for arm in arms:
        out[arm] = {}
        for point in points:
            run_at = Point(point.lr, points[0].alpha) if arm == "frozen" else point  # no LoRA: alpha changes nothing
            if run_at in out[arm]:
                out[arm][point] = out[arm][run_at]
                continue
            try:
                out[arm][point] = score(arm_run(runner, task, arm, cfg.seeds[0], run_at, "select"))
            except RoundFailed:
                out[arm][point] = float("nan")
    return out


def glue_e1(cfg: Config, e1: E1Scores, runner: Runner, notes: list[str]) -> dict:
    """Chooses each arm's grid point and runs every arm and seed on each GLUE task (and E2 on glue.budget_task);
    returns the learned claim's record, the E2 claim's (None without a budget task) and the GLUE part's metrics."""
    backbone = load_backbone(cfg.glue.backbone)
    choices, chance, plateau, gated, e2 = {}, {}, {}, {}, None
    for name in cfg.glue.task_names:
        task = load_task(cfg, name, backbone, runner)
        chance[name] = task.chance
        e1.scores[name, "chance"] = [task.chance] * len(cfg.seeds)  # a constant: the table's floor column
        choices[name] = run_arms(cfg, runner, task, e1, REFERENCES)
        plateau[name] = last_quarter_gain(runner.records, name)
        gated[name] = not cfg.glue.gate or bool(learned_tasks(decide_learned(e1, {name: task.chance}), [name]))
        if gated[name]:
            choices[name] |= run_arms(cfg, runner, task, e1, METHODS)
        if name == cfg.glue.budget_task and gated[name]:
            fslora = choices[name]["fslora"]
            e2 = equal_budget(cfg, runner, task, e1, Point(fslora["lr"], fslora["lora_alpha"]))
        elif name == cfg.glue.budget_task:
            e2 = not_run(GLUE_EQUAL_BUDGET, f"{name} is not shown to be learned (glue.gate)")
    notes.append(selection_table(cfg, choices, chance, plateau))
    if not all(gated.values()):
        notes.append("The five methods did not run on " + ", ".join(t for t, ran in gated.items() if not ran)
                     + ": centralised LoRA was not shown above chance and the frozen head there (the task's own two "
                     "cells, Holm), so the task cannot order the methods (glue.gate).")
    learned = decide_learned(e1, chance)
    metrics = {"glue_grid": [str(p) for p in grid(cfg)], "glue_choice": choices, "glue_chance": chance,
               "glue_centralised_last_quarter_gain": plateau, "glue_methods_ran": gated}
    return {"learned": learned, "e2": e2, "metrics": metrics}


def run_arms(cfg: Config, runner: Runner, task: GlueTask, e1: E1Scores, arms: tuple[str, ...]) -> dict[str, dict]:
    """Chooses each arm's grid point on the selection slice and runs it over the seeds on dev (recorded in `e1`);
    returns arm -> {lr, lora_alpha, selection_scores}."""
    scores = choose(cfg, runner, task, arms)
    chosen = {arm: best(by_point) for arm, by_point in scores.items()}
    for seed in cfg.seeds:
        for arm in arms:
            e1.record(task.name, arm, arm_run(runner, task, arm, seed, chosen[arm], "dev"))
    return {arm: {"lr": chosen[arm].lr, "lora_alpha": chosen[arm].alpha,
                  "selection_scores": {str(p): None if np.isnan(v) else round(v, 2) for p, v in scores[arm].items()}}
            for arm in arms}


def equal_budget(cfg: Config, runner: Runner, task: GlueTask, e1: E1Scores, point: Point) -> dict:
    """E2 on the task: FedLoRA's E1 runs (ratio 1, T rounds) against FSLoRA at the budget ratio for T / ratio, at
    FSLoRA's chosen grid point."""
    ratio, fed = cfg.ablations.budget_ratio, runner.fed
    sketched = np.array([score(arm_run(runner, task, "fslora", seed, point, "dev", round(fed.rounds / ratio), ratio))
                         for seed in cfg.seeds])
    unsketched = np.array(e1.scores[task.name, "fedlora"])
    return GLUE_EQUAL_BUDGET.decide(sketched, unsketched, task=task.name, budget_ratio=ratio, rank=fed.rank,
                                    sketched_rounds=round(fed.rounds / ratio), unsketched_rounds=fed.rounds,
                                    point=str(point), mean_points={"sketched": float(sketched.mean()),
                                                                   "unsketched": float(unsketched.mean())})


def decide_learned(e1: E1Scores, chance: dict[str, float]) -> dict:
    cells = {}
    for task, floor in chance.items():
        central = np.array(e1.scores[task, "centralised"])
        cells[f"{task} > chance"] = (central, np.full_like(central, floor))
        cells[f"{task} > frozen"] = (central, np.array(e1.scores[task, "frozen"]))
    means = {t: {a: float(np.mean(e1.scores[t, a])) for a in REFERENCES} | {"chance": c} for t, c in chance.items()}
    return LEARNED.decide_cells(cells, mean_points=means)


def learned_tasks(record: dict, tasks: list[str]) -> list[str]:
    """The tasks whose two learned cells the claim confirmed."""
    cells = record.get("cells", {})
    return [t for t in tasks if all(cells.get(f"{t} > {floor}", {}).get("confirmed") for floor in ("chance",
                                                                                                    "frozen"))]


def last_quarter_gain(records: list[dict], task: str) -> float:
    """How much centralised LoRA's dev score rose over the last quarter of rounds (mean over seeds, points): near
    zero when the budget lets the upper reference converge."""
    runs: dict[int, list[tuple[int, float]]] = {}
    for r in records:
        if (r.get("problem"), r.get("method"), r.get("scored_on"), r.get("experiment")) == (task, "centralised",
                                                                                              "dev", "E1"):
            runs.setdefault(r["seed"], []).append((r["round"], 100 * r.get("pearson", r.get("accuracy", 0.0))))
    gains = []
    for curve in runs.values():
        curve.sort()
        last = curve[-1][0]
        before = max((c for c in curve if c[0] <= 0.75 * last), default=curve[0])
        gains.append(curve[-1][1] - before[1])
    return round(float(np.mean(gains)), 2) if gains else float("nan")


def selection_table(cfg: Config, choices: dict, chance: dict, plateau: dict) -> str:
    """Markdown: per task and arm, the selection-slice score at each grid point and the point chosen."""
    points = grid(cfg)
    lines = [f"GLUE hyperparameters, chosen per task and arm from one grid (lr x LoRA alpha) on a held-out "
             f"{cfg.glue.select_fraction:.0%} slice of the task's training examples (seed {cfg.seeds[0]}; the dev "
             "split is never used to choose), scores in points on that slice. A gain near 0 over the last quarter "
             "of rounds means the budget lets centralised LoRA converge:", "",
             "| task | arm | " + " | ".join(str(p) for p in points) + " | chosen |",
             "|---|---|" + "---|" * (len(points) + 1)]
    for task, arms in choices.items():
        for arm, choice in arms.items():
            cells = " | ".join("–" if v is None else f"{v:.1f}" for v in choice["selection_scores"].values())
            lines.append(f"| {task} | {arm} | {cells} | {Point(choice['lr'], choice['lora_alpha'])} |")
    lines += ["", "Chance on dev: " + ", ".join(f"{t} {c:.1f}" for t, c in chance.items()) + ". Centralised LoRA's dev "
              "gain over the last quarter of rounds: " + ", ".join(f"{t} {g:+.2f}" for t, g in plateau.items()) + "."]
    return "\n".join(lines)


# GLUE settings added after runs were cached, at the value those runs had: a setting at it stays out of the key,
# so the cached runs still match; another value keys new runs
LEGACY_GLUE = {"pair_max_length": None, "segments": False, "min_words": {}, "precision": "float32",
               "select_eval_every": None}


def glue_fingerprint(cfg: Config) -> str:
    """Every setting that changes a GLUE run's numbers (not which tasks, seeds or arms run); with a JSONL task, its
    file's sha256 and dev fraction too."""
    legacy = {k for k, v in LEGACY_GLUE.items() if getattr(cfg.glue, k) == v}  # as before these settings existed
    settings = {"glue": cfg.glue.model_dump(mode="json", exclude={"tasks", "budget_task", "gate", "data"} | legacy),
                "federation": federation_settings(cfg.glue_federation(), cfg.engine),
                "budget_ratio": cfg.ablations.budget_ratio}
    if cfg.glue.data is not None:
        settings["data"] = {"sha256": file_hash(cfg.glue.data.path), "dev_fraction": cfg.glue.data.dev_fraction}
    return fingerprint(settings)
