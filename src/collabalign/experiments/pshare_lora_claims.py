"""The paper's ordering as paired claims over seeds, and the mean ± std table: shared by every P-ShareLoRA part
(synthetic, text, federated)."""

from __future__ import annotations

import numpy as np

from collabalign.methods.pshare_lora import LABELS
from collabalign.runs import claim


def difference(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of the paired differences a - b over seeds and its standard error (inf for one seed)."""
    d = np.asarray(a) - np.asarray(b)
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("inf")


def paired(better: list[float], worse: list[float], strict: bool) -> tuple[str, dict]:
    """Verdict on `better` (>, or >= when not strict) `worse` over paired seeds, with the mean difference and its
    standard error: a difference within 2 standard errors of the boundary is inconclusive."""
    mean, se = difference(better, worse)
    if strict:
        verdict = "reproduced" if mean > 2 * se else "not reproduced" if mean < -2 * se else "inconclusive"
    else:
        verdict = "reproduced" if mean >= 0 else "not reproduced" if mean < -2 * se else "inconclusive"
    return verdict, {"mean_difference": round(mean, 4), "std_error": round(se, 4), "seeds": len(better)}


def within_band(a: list[float], b: list[float], band: float) -> tuple[str, dict]:
    """`a` equals `b` within ±band over paired seeds: reproduced if mean ± 2 SE of the difference lies inside the
    band, not reproduced if it lies wholly outside, else inconclusive."""
    mean, se = difference(a, b)
    verdict = "reproduced" if abs(mean) + 2 * se <= band else "not reproduced" if abs(mean) - 2 * se > band \
        else "inconclusive"
    return verdict, {"mean_difference": round(mean, 4), "std_error": round(se, 4), "band": band, "seeds": len(a)}


def table(acc: dict[str, dict[str, list[float]]], methods: list[str], oracle: float) -> str:
    """Markdown table: mean ± std over seeds of each metric, one row per method."""
    cols = ("accuracy", "sign_agreement", "param_error", "subspace_dist", "reward_diff_mse")
    lines = [f"Synthetic comparison (oracle accuracy {oracle:.3f}; mean ± std over seeds):", "",
             "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for m in methods:
        cells = [f"{np.mean(acc[m][c]):.4f} ± {np.std(acc[m][c]):.4f}" for c in cols]
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ordering_claims(acc: dict[str, dict[str, list[float]]]) -> list[dict]:
    """The paper's ordering (Fig. 1–3): G/WU >= SI > global, local; G/WU best; share B beats share A."""
    a = {m: v["accuracy"] for m, v in acc.items()}
    out = []
    for better, worse, strict, name in (
            ("pshare_g", "pshare_si", False, "P-ShareLoRA (G) >= P-ShareLoRA (SI)"),
            ("pshare_wu", "pshare_si", False, "P-ShareLoRA (WU) >= P-ShareLoRA (SI)"),
            ("pshare_si", "global", True, "P-ShareLoRA (SI) > LoRA-global"),
            ("pshare_si", "local", True, "P-ShareLoRA (SI) > LoRA-local"),
            ("pshare_si", "share_a", True, "sharing B (SI) > sharing A (App. D.3; true here by construction)")):
        if better in a and worse in a:
            verdict, measured = paired(a[better], a[worse], strict)
            out.append(claim(name, verdict, measured, "held-out accuracy, paired over seeds"))
    ours = [m for m in ("pshare_g", "pshare_wu") if m in a]
    baselines = [m for m in ("global", "local", "share_rep") if m in a]
    if ours and baselines:
        best = max(ours, key=lambda m: np.mean(a[m]))
        rival = max(baselines, key=lambda m: np.mean(a[m]))
        verdict, measured = paired(a[best], a[rival], True)
        out.append(claim("The best of P-ShareLoRA (G)/(WU) beats every baseline", verdict,
                         {"ours": LABELS[best], "best_baseline": LABELS[rival], **measured},
                         "held-out accuracy, paired over seeds"))
    return out
