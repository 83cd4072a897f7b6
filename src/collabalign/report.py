"""report.md for a run directory: the claims table, a metrics table and PNG plots
(a metric per round per method, bytes per round per method)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from collabalign.plotting import finish, line_plot, plt
from collabalign.runs import RunDir, atomic_write_text


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
            value = r[metric]  # null: a non-finite value (`runs.metric_line`), a gap in the line
            series[label][r["round"]].append(float("nan") if value is None else float(value))
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
    finish(fig, ax, "MB sent (down + up, all clients)", "communication per round", path)
    return True


SMOKE_LINE = ("**Smoke run.** This is a quick config: few seeds and short training, so its verdicts are low-power "
              "checks that the pipeline runs, not evidence. The main config's report is the evidence.")


def claims_table(claims: list[dict[str, Any]]) -> list[str]:
    """The claims as markdown: rule and margin, replicates, estimate with its 95% interval, verdict; a claim added
    after its results were seen is marked post hoc; the measured context follows the table."""
    lines = ["## Claims", "", "Every verdict is decided by `claims.py`: paired 95% t-intervals over seeds (bootstrap "
             "from 20 replicates), fewer than 3 replicates inconclusive, Holm across cells.", "",
             "| claim | expected | rule (margin) | n | estimate [95% interval] | verdict |",
             "|---|---|---|---|---|---|"]
    details = []
    for c in claims:
        name = c["name"] + (" *(post hoc)*" if c.get("post_hoc") else "")
        rule = c["rule"] + (" on ratios" if c.get("scale") == "ratio" else "")
        margin = c.get("margin")
        if margin not in (None, 0, 0.0):  # a ratio margin m is the factor 1 + m
            rule += f" (factor {1 + margin:g})" if c.get("scale") == "ratio" and c["rule"] != "band" else \
                f" ({_fmt(margin)})"
        if "holm" in c:
            rule += f", Holm over {c['holm']['cells']} cells (worst shown)"
        iv = c.get("interval")
        estimate = _fmt(c["estimate"]) + (f" [{_fmt(iv[0])}, {_fmt(iv[1])}]" if iv else "")
        lines.append(f"| {name} | {c['expected']} | {rule} | {c['n']} | {estimate} | **{c['verdict']}** |")
        context = dict(c.get("measured", {}))
        if "cells" in c:
            context["cells"] = {k: f"{_fmt(v['estimate'])} {v['interval']}" for k, v in c["cells"].items()}
        if context:
            details.append(f"- {c['name']}: {_fmt(context)}")
    return lines + ([""] + details if details else [])


def write_report(path: str | Path, title: str = "", plot_metrics: tuple[str, ...] = ()) -> Path:
    """(Re)writes report.md in the run directory from its summary.json, metrics.jsonl and ledger.csv."""
    run = RunDir(path)
    done = (run.path / "summary.json").exists()
    summary = run.read_summary() if done else {"claims": [], "metrics": {}}
    records = run.read_metrics() if (run.path / "metrics.jsonl").exists() else []
    metrics_to_plot = plot_metrics or tuple(summary.get("plot_metrics", ("accuracy",)))  # [] in summary: none
    lines = [f"# {title or summary.get('title', run.path.name)}", ""]
    status = run.read_status()
    if status.get("status", "finished") != "finished" or not done:
        lines += progress_lines(run, status), ""
    if run.read_config().get("smoke"):
        lines += [SMOKE_LINE, ""]
    if summary.get("notes"):
        lines += [line for n in summary["notes"] for line in (str(n), "")]  # a paragraph or table each
    lines += claims_table(summary["claims"])
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


def progress_lines(run: RunDir, status: dict[str, Any]) -> str:
    """For a run that has not finished: its status and error, and how far each checkpointed simulation got."""
    state = status.get("status", "unknown (no status.json)")
    text = f"**Status: {state}**" + (f" — {status['error']}" if status.get("error") else "") + ". "
    sims = sorted((run.path / "checkpoints").glob("*/rounds.jsonl"))
    if not sims:
        return text + "No completed round yet; `collabalign resume` continues the run."
    last = {p.parent.name: json.loads(p.read_text().splitlines()[-1]) for p in sims if p.read_text().strip()}
    return text + "Simulations so far (last completed round each): " + "; ".join(
        f"{name}: round {rec.get('round')}" for name, rec in last.items()) + ". `collabalign resume` continues it."


def summarise_reports(paths: list[Path], out: Path) -> Path:
    """An index report.md linking each experiment's report with its claim verdicts."""
    lines = ["# collabalign reproductions", "", "| experiment | claim | verdict |", "|---|---|---|"]
    for p in paths:
        summary = json.loads((p / "summary.json").read_text())
        for c in summary["claims"]:
            lines.append(f"| [{p.name}]({p.name}/report.md) | {c['name']} | **{c['verdict']}** |")
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    return out / "report.md"
