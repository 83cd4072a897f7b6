"""The FSLoRA reproduction's plots: E1 score per round per problem; E2–E4 score against rank or ratio; E3–E5 score
against uploaded MB per device."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from collabalign.experiments.fslora.runner import headline
from collabalign.plotting import line_plot


def plot_e1(records: list[dict], plots: Path, problems: list[str]) -> None:
    """The headline score (accuracy; STS-B: Pearson) per round on the scored rows, mean over seeds, one PNG per E1
    problem, the references (centralised, frozen) beside the methods."""
    for problem in problems:
        by = defaultdict(lambda: defaultdict(list))
        for r in records:
            if r.get("experiment") == "E1" and r["problem"] == problem and r.get("scored_on", "dev") == "dev":
                by[r["method"]][r["round"]].append(headline(r))
        series = {m: (sorted(v), [float(np.mean(v[t])) for t in sorted(v)]) for m, v in by.items()}
        slug = problem.replace(" ", "_").replace("=", "")
        line_plot(plots / f"E1_{slug}.png", series, "round", "score (points)", f"E1: {problem}")


def plot_ablations(means: dict, records: list[dict], plots: Path, many_devices: int | None = None) -> None:
    """E2 (and E2 with `many_devices` devices) and E3, E4: mean score over seeds against rank or ratio; E3–E5: score
    against cumulative upload per device."""
    plot_equal_budget(plots / "E2_equal_budget.png", means["E2"], "E2: equal upload budget")
    if "E2_many_devices" in means:
        plot_equal_budget(plots / "E2_many_devices.png", means["E2_many_devices"],
                          f"E2: equal upload budget, {many_devices} devices")
    for name, file, label, title in (("E3", "E3_ratio", "sketching ratio k/r", "E3: sketching ratio at fixed r"),
                                     ("E4", "E4_global_rank", "global rank r", "E4: global rank at fixed k")):
        xs = sorted(means[name])
        line_plot(plots / f"{file}.png", {"fslora": (xs, [means[name][x] for x in xs])}, label, "score (points)",
                  title, log_x=True)
    for name, file, title in (("E3", "E3_upload", "E3: sketching ratio at fixed r and rounds, accuracy vs upload"),
                              ("E4", "E4_upload", "E4: global rank at fixed k, accuracy vs upload"),
                              ("E5", "E5_topk_upload", "E5: top-k + sketching, accuracy vs upload")):
        plot_upload(plots / f"{file}.png", records, name, title)


def plot_equal_budget(path: Path, by_rank: dict[str, dict[str, float]], title: str) -> None:
    """E2's mean scores ("r=8" -> {"unsketched": ..., "sketched": ...}) against the global rank."""
    ranks = [int(k[2:]) for k in by_rank]
    line_plot(path, {v: (ranks, [by_rank[k][v] for k in by_rank]) for v in ("unsketched", "sketched")},
              "global rank r", "score (points)", title, log_x=True)


def plot_upload(path: Path, records: list[dict], experiment: str, title: str) -> None:
    """The headline score against cumulative uploaded MB per device, one line per variant of `experiment`, means
    over seeds of each evaluated round."""
    curves = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("experiment") == experiment:
            curves[r["variant"]][r["round"]].append((r["upload_mb_per_device"], headline(r)))
    series = {v: ([float(np.mean([x for x, _ in by[t]])) for t in sorted(by)],
                  [float(np.mean([y for _, y in by[t]])) for t in sorted(by)]) for v, by in curves.items()}
    line_plot(path, series, "uploaded MB per device", "score (points)", title)
