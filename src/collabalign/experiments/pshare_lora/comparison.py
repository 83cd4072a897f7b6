"""The §8.1 synthetic comparison: every method on the bilinear preference problem over seeds (mean ± std table),
with the paper's ordering as claims (`ordering.py`)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from collabalign.experiments.pshare_lora.config import Config
from collabalign.experiments.pshare_lora.fits import Fits
from collabalign.experiments.pshare_lora.ordering import ordering_claims
from collabalign.methods.pshare_lora import LABELS
from collabalign.runs import Part

TABLE_COLUMNS = ("accuracy", "sign_agreement", "param_error", "subspace_dist", "reward_diff_mse")


def comparison_part(cfg: Config, fits: Fits) -> Part:
    """Records, ordering claims, summary metrics, the table and notes of the main comparison from the finished fits."""
    records, acc = [], defaultdict(lambda: defaultdict(list))
    for method in cfg.methods:
        for seed in cfg.seeds:
            res = fits[cfg.problem.model_dump_json(), method, seed]
            records.append({"experiment": "main", "method": method, "seed": seed, "n_train": cfg.problem.n_train,
                            **res})
            for key, value in res.items():
                acc[method][key].append(value)
    first = acc[cfg.methods[0]]
    diversity = {k: round(float(np.mean(first[k])), 4) for k in ("nu", "sigma_tail", "bias_mean", "oracle_accuracy")}
    metrics = {"main": {LABELS[m]: {k: round(float(np.mean(v[k])), 4) for k in ("accuracy", "param_error",
                                                                               "subspace_dist")}
                        for m, v in acc.items()}, "diversity": diversity}
    p = cfg.problem
    notes = [table(acc, cfg.methods, diversity["oracle_accuracy"]),
             f"Truth: nu = {diversity['nu']}, Sigma_tail = {diversity['sigma_tail']}; d1 = {p.d1}, d2 = {p.d2}, "
             f"N = {p.users}, k = {p.k}, rho = {p.rho}, eta = {p.tail}, N_p = {p.n_train}; {cfg.train.steps} "
             f"full-batch Adam steps (lr {cfg.train.lr}) per method; sweeps over seeds {cfg.sweep_seeds()}."]
    if "share_rep" in cfg.methods:
        notes.append(f"Share Rep is the linear shared-representation model: vec(Delta Theta_i) = Psi omega_i with Psi "
                     f"({p.d1 * p.d2} x {p.k}) shared and learned jointly, and a head omega_i ({p.k}) per user, "
                     "trained together over the whole budget.")
    if p.depth == 1 and "share_rep_phased" in cfg.methods:
        notes.append("With depth 1 the model has a single LoRA layer, so the phased Share Rep ablation has no layer "
                     "below to freeze: it is a global phase followed by per-user factors (both A and B) on that layer.")
    claims = ordering_claims({m: v["accuracy"] for m, v in acc.items()})
    return Part(claims, records, metrics, notes)


def table(acc: dict[str, dict[str, list[float]]], methods: list[str], oracle: float) -> str:
    """Markdown table: mean ± std over seeds of each metric, one row per method."""
    lines = [f"Synthetic comparison (oracle accuracy {oracle:.3f}; mean ± std over seeds):", "",
             "| method | " + " | ".join(TABLE_COLUMNS) + " |", "|---|" + "---|" * len(TABLE_COLUMNS)]
    for m in methods:
        cells = [f"{np.mean(acc[m][c]):.4f} ± {np.std(acc[m][c]):.4f}" for c in TABLE_COLUMNS]
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
