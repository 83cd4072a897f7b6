"""report.md for a run directory: the claims table, a metrics table and PNG plots
(a metric per round per method, bytes per round per method)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from collabalign.runs import RunDir, atomic_write_text  # noqa: E402


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def plot_metric_per_round(records: list[dict[str, Any]], metric: str, path: Path, title: str = "") -> bool:
    """Mean over seeds of `metric` against round, one line per method (and per extra `group` if present)."""
    series: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if metric in r and "round" in r:
            label = r.get("method", "run") + (f" ({r['group']})" if "group" in r else "")
            series[label][r["round"]].append(float(r[metric]))
    if not series:
        return False
    lines = {label: (sorted(by_round), [sum(by_round[x]) / len(by_round[x]) for x in sorted(by_round)])
             for label, by_round in sorted(series.items())}
    line_plot(path, lines, "round", metric, title or f"{metric} per round")
    return True


def plot_bytes_per_round(run: RunDir, path: Path) -> bool:
    """Total bytes (down + up) per round for each method's ledger."""
    ledgers = run.read_ledgers()
    if not ledgers:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, ledger in sorted(ledgers.items()):
        per_round = ledger.per_round()
        rounds = sorted(per_round)
        ax.plot(rounds, [(per_round[x]["down"] + per_round[x]["up"]) / 1e6 for x in rounds], marker=".", label=method)
    _finish(fig, ax, "MB sent (down + up, all clients)", "communication per round", path)
    return True


def line_plot(path: Path, series: dict[str, tuple[list[float], list[float]]], xlabel: str, ylabel: str,
              title: str, log_x: bool = False) -> None:
    """One line per label (x values, y values), saved as PNG at `path`."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker=".", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    _finish(fig, ax, ylabel, title, path, xlabel)


def _finish(fig: plt.Figure, ax: plt.Axes, ylabel: str, title: str, path: Path, xlabel: str = "round") -> None:
    """Labels a line plot, adds the legend and saves it as PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(path: str | Path, title: str = "", plot_metrics: tuple[str, ...] = ()) -> Path:
    """(Re)writes report.md in the run directory from its summary.json, metrics.jsonl and ledger.csv."""
    run = RunDir(path)
    summary = run.read_summary()
    records = run.read_metrics() if (run.path / "metrics.jsonl").exists() else []
    metrics_to_plot = plot_metrics or tuple(summary.get("plot_metrics", ("accuracy",)))  # [] in summary: none
    lines = [f"# {title or summary.get('title', run.path.name)}", ""]
    if summary.get("notes"):
        lines += [line for n in summary["notes"] for line in (str(n), "")]  # a paragraph or table each
    lines += ["## Claims", "", "| claim | expected | measured | verdict |", "|---|---|---|---|"]
    for c in summary["claims"]:
        lines.append(f"| {c['name']} | {c['expected']} | {_fmt(c['measured'])} | **{c['verdict']}** |")
    lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in _flatten(summary.get("metrics", {})).items()]
    plots = []
    for metric in metrics_to_plot:
        target = run.path / "plots" / f"{metric}_per_round.png"
        if plot_metric_per_round(records, metric, target):
            plots.append(target)
    if plot_bytes_per_round(run, run.path / "plots" / "bytes_per_round.png"):
        plots.append(run.path / "plots" / "bytes_per_round.png")
    plots += sorted(p for p in (run.path / "plots").glob("*.png") if p not in plots)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots]
    lines += ["", "## Run", "", "Config and environment: `config.yaml`; per-round records: `metrics.jsonl`;",
              "bytes per message: `ledger.csv`; claims: `summary.json`.", ""]
    out = run.path / "report.md"
    atomic_write_text(out, "\n".join(lines))
    return out


def summarise_reports(paths: list[Path], out: Path) -> Path:
    """An index report.md linking each experiment's report with its claim verdicts."""
    lines = ["# collabalign reproductions", "", "| experiment | claim | verdict |", "|---|---|---|"]
    for p in paths:
        summary = json.loads((p / "summary.json").read_text())
        for c in summary["claims"]:
            lines.append(f"| [{p.name}]({p.name}/report.md) | {c['name']} | **{c['verdict']}** |")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    return out / "report.md"
