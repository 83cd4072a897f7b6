"""Tables and the report paragraph of the reward-model part: accuracy mean +- std over runs per (n, delta) and
method, the compact per-delta summary for summary.json, and markdown tables for the report."""

from __future__ import annotations

import numpy as np

LABELS = {"il": "independent", "fedavg": "pooled (FedAvg)", "finetune": "fine-tuning", "ditto": "Ditto",
          "affpcl": "AffPCL", "affpcl_dre": "AffPCL w/ DRE", "affpcl_plugin": "AffPCL, spec plug-in rho"}


def table_cells(acc: dict, dist: dict, bayes: dict) -> dict:
    """One dataset and variant: per "n/delta" cell the Bayes accuracy and each method's accuracy mean, std over runs
    and (when defined) mean squared distance to w^i_*."""
    return {f"{n}/{d:g}": {"bayes": round(bayes[n, d], 4),
                           **{m: {"mean": round(float(v.mean()), 4),
                                  "std": round(float(v.std(ddof=1)), 4) if v.size > 1 else 0.0,
                                  **({"w_dist": round(float(dist[n, d][m].mean()), 4)} if dist[n, d] else {})}
                              for m, v in acc[n, d].items()}}
            for n, d in acc}


def mean_over_n(cells: dict) -> dict:
    """Compact summary for summary.json: accuracy per delta and method, averaged over the n values."""
    by_delta: dict[str, dict[str, list[float]]] = {}
    for cell, by in cells.items():
        slot = by_delta.setdefault(cell.split("/")[1], {})
        for m, v in by.items():
            slot.setdefault(m, []).append(v if m == "bayes" else v["mean"])
    return {d: {m: round(float(np.mean(v)), 4) for m, v in ms.items()} for d, ms in by_delta.items()}


def reward_table(cfg, table: dict) -> list[str]:
    """Markdown tables (one per dataset and variant) for the report; cfg is the part's RewardConfig."""
    out = []
    for key, cells in table.items():
        methods = [m for m in LABELS if m in next(iter(cells.values()))]
        lines = [f"Reward models, {key}: expected held-out preference accuracy (annotator mean; mean +- std over "
                 f"{cfg.runs} runs)", "",
                 "| n | delta | Bayes | " + " | ".join(LABELS[m] for m in methods) + " |",
                 "|---|---|---|" + "---|" * len(methods)]
        for cell, by in cells.items():
            n, d = cell.split("/")
            best = max(by[m]["mean"] for m in methods)
            vals = [(f"**{by[m]['mean']:.3f}**" if by[m]["mean"] == best else f"{by[m]['mean']:.3f}")
                    + f" +- {by[m]['std']:.3f}" for m in methods]
            lines.append(f"| {n} | {d} | {by['bayes']:.3f} | " + " | ".join(vals) + " |")
        out.append("\n".join(lines))
    return out


def note(cfg) -> str:
    """The report paragraph describing the reward-model part; cfg is the part's RewardConfig."""
    return (f"Personalised reward models (spec §8.3). Items: pairs with features z = phi(x, y_a) - phi(x, y_b) and "
            f"K = 3 attribute margins; synthetic: z ~ N(0, I/{cfg.synthetic_d}) ({cfg.synthetic_items} items), "
            "attributes exactly linear in z; hh: a seeded subset of "
            f"{cfg.hh_pairs} HH-RLHF harmless-base test pairs, phi = mean-pooled all-MiniLM-L6-v2 of (last human "
            f"turn, reply) at {cfg.hh_max_length} tokens, top {cfg.hh_dim} principal components; attributes "
            "harmless (reply is the dataset's `chosen`), length (log(1 + MiniLM tokens)), apology (apology / refusal "
            "words; VADER is not installed), standardised. Annotator i: lambda^i = lambda-bar + delta u_i, "
            f"lambda-bar = {cfg.lam_bar}, u_i uniform on the unit sphere; BT labels with logit {cfg.scale:g} "
            f"a^T lambda^i. All annotators draw from one training pool (no item shift); {cfg.steps} steps, batch "
            f"{cfg.batch}, step {cfg.alpha:g}, Ditto reg {cfg.reg:g}; fine-tuning pooled for half the steps. R1 "
            "regresses the observed scalarised margin (AffPCL with COE on the attributes); R2 (BT) and R3 (least "
            "squares) see only the label; their 'AffPCL' uses the true label-law ratio (oracle, like Fig. 3's true "
            "rho), a plug-in from independently learned per-annotator models of the same loss (w/ DRE), or the "
            "spec's plug-in from the personal iterates (which never leaves FedAvg: a fixed point at zero "
            "initialisation). Accuracy: expected held-out accuracy under the annotator's BT labels on "
            f"{cfg.test_share:.0%} held-out items, mean of the last {cfg.window} evaluations; 'Bayes' is the accuracy "
            "of the annotator's true margin. Claims compare per-run accuracy differences, paired over runs, with a "
            "1-point margin.")
