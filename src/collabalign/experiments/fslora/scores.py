"""E1's scores per problem, method and seed; the paper's Tables 5.1 and 5.2; the report's E1 tables (mean ± std
over seeds, the paper's number beside)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from collabalign.experiments.fslora.runner import METHODS, RunSummary, score

# Table 5.1 (RoBERTa-base, r = 64, 200 rounds x 50 steps), by score key
_TABLE_5_1_COLUMNS = ("QNLI", "MRPC", "CoLA", "MNLI", "RTE", "SST-2", "QQP")  # accuracy, CoLA too
PAPER_TABLE = {m: dict(zip(_TABLE_5_1_COLUMNS, row, strict=True)) for m, row in {
    "heterolora": (87.5, 84.4, 75.3, 66.3, 69.0, 89.5, 85.3),
    "flexlora": (88.5, 81.2, 77.5, 63.0, 62.2, 92.8, 87.4),
    "fedstack": (87.2, 78.1, 77.4, 74.6, 54.4, 93.4, 87.1),
    "fslora": (88.0, 87.3, 82.2, 76.4, 69.8, 93.5, 85.8)}.items()}

# Table 5.2 (LLaMA-3.2-3B, r = 64, 750 rounds x 20 steps), by score key; "commonsense" = the paper's Avg.
_TABLE_5_2_COLUMNS = tuple(f"commonsense/{t}" for t in ("ARC-Challenge", "ARC-Easy", "boolq", "hellaswag",
                                                         "openbookqa", "piqa", "social_i_qa", "winogrande")) + (
    "commonsense",)
PAPER_TABLE_5_2 = {m: dict(zip(_TABLE_5_2_COLUMNS, row, strict=True)) for m, row in {
    "heterolora": (69.2, 84.6, 68.4, 80.0, 69.9, 77.3, 68.7, 72.0, 73.8),
    "flexlora": (69.9, 84.7, 66.9, 80.5, 72.3, 78.1, 70.4, 73.3, 74.5),
    "fedstack": (67.5, 83.1, 65.8, 78.4, 69.2, 75.5, 67.1, 71.5, 72.3),
    "fslora": (73.8, 86.2, 68.5, 83.1, 78.7, 82.0, 75.8, 74.8, 77.9)}.items()}


class E1Scores:
    """Per (problem, method): final scores and LoRA's share of them (the score minus that of the same head with
    Delta W = 0), one per seed in seed order; per method: (device s, server s) of each timed run."""

    def __init__(self) -> None:
        self.scores: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.gains: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.timing: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def record(self, problem: str, method: str, result: RunSummary, timed: bool = False) -> None:
        final = result.metrics[-1]
        self.scores[problem, method].append(score(result))
        self.gains[problem, method].append(score(result) - final["score_without_lora"])
        if "matthews" in final:  # CoLA's GLUE metric, beside the accuracy the paper reports
            self.scores[f"{problem} (MCC)", method].append(100 * final["matthews"])
        for key in final:
            if key.startswith("accuracy/"):  # per-task accuracy of a multi-task problem (commonsense)
                self.scores[f"{problem}/{key[len('accuracy/'):]}", method].append(100 * final[key])
        if timed:
            self.timing[method].append((sum(t["client_s"] for t in result.timing),
                                        sum(t["server_s"] for t in result.timing)))


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def score_table(scores: dict, rows: list[tuple[str, str]], paper: dict, caption: str,
                columns: tuple[str, ...] = METHODS) -> str:
    """Markdown table of (label, score key) rows: mean ± std over seeds per column (method or reference arm), the
    paper's number beside; a dash where the arm did not run on the row's problem."""
    lines = [caption, "", "| problem | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, key in rows:
        cells = []
        for m in columns:
            if not scores.get((key, m)):
                cells.append("–")
                continue
            mu, sd = mean_std(scores[key, m])
            number = paper.get(m, {}).get(key)
            cells.append(f"{mu:.1f} ± {sd:.1f}" + (f" (paper {number})" if number is not None else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gain_table(gains: dict, problems: list[str]) -> str:
    """Markdown table of how much LoRA adds: the final score minus that of the same trained head on the frozen
    backbone (Delta W = 0), mean over seeds. Near zero means the head, not the adapter, decided the score."""
    lines = ["LoRA's share of E1: final score minus the score of the same head with Delta W = 0 (points, mean over "
             "seeds):", "", "| problem | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    lines += [f"| {p} | " + " | ".join(f"{np.mean(gains[p, m]):+.1f}" for m in METHODS) + " |"
              for p in problems if (p, METHODS[0]) in gains]
    return "\n".join(lines)
