"""The FSLoRA reproduction's plots: E1 score per round per problem; E2–E4 score against rank or ratio; E5 score
against uploaded MB per device."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from collabalign.plotting import line_plot


def plot_e1(records: list[dict], plots: Path, problems: list[str]) -> None:
    """Accuracy (or Matthews corr.) per round, mean over seeds, one PNG per E1 problem."""
    for problem in problems:
        by = defaultdict(lambda: defaultdict(list))
        for r in records:
            if r.get("experiment") == "E1" and r["problem"] == problem:
                by[r["method"]][r["round"]].append(100 * r.get("matthews", r["accuracy"]))
        series = {m: (sorted(v), [float(np.mean(v[t])) for t in sorted(v)]) for m, v in by.items()}
        slug = problem.replace(" ", "_").replace("=", "")
        line_plot(plots / f"E1_{slug}.png", series, "round", "score (points)", f"E1: {problem}")


def plot_ablations(means: dict, records: list[dict], plots: Path) -> None:
    """E2–E4 mean score over seeds against rank or ratio; E5 score against cumulative upload per device."""
    e2 = means["E2"]
    ranks = [int(k[2:]) for k in e2]
    line_plot(plots / "E2_equal_budget.png", {v: (ranks, [e2[k][v] for k in e2]) for v in ("unsketched", "sketched")},
              "global rank r", "score (points)", "E2: equal upload budget", log_x=True)
    for name, file, label, title in (("E3", "E3_ratio", "sketching ratio k/r", "E3: sketching ratio at fixed r"),
                                     ("E4", "E4_global_rank", "global rank r", "E4: global rank at fixed k")):
        xs = sorted(means[name])
        line_plot(plots / f"{file}.png", {"fslora": (xs, [means[name][x] for x in xs])}, label, "score (points)",
                  title, log_x=True)
    curves = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("experiment") == "E5":
            curves[r["variant"]][r["round"]].append((r["upload_mb_per_device"], 100 * r["accuracy"]))
    series = {v: ([float(np.mean([x for x, _ in by[t]])) for t in sorted(by)],
                  [float(np.mean([y for _, y in by[t]])) for t in sorted(by)]) for v, by in curves.items()}
    line_plot(plots / "E5_topk_upload.png", series, "uploaded MB per device", "score (points)",
              "E5: top-k + sketching, accuracy vs upload")
