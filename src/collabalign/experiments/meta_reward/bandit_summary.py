"""The bandit part's summaries: the reward models, the mean metrics per protocol, meta-training and the per-run
records."""

from __future__ import annotations

from typing import Any

import torch

from collabalign.experiments.meta_reward.bandit_methods import BanditConfig, Table
from collabalign.experiments.meta_reward.problems.bandit import Rows


def table_rows_index(rows: Rows, folds: list[int], sh: int, beta: float) -> list[int]:
    """The row of (fold, s_h, β) for each fold of `folds`."""
    return [next(m for m in range(len(rows)) if int(rows.fold[m]) == h and int(rows.sh[m]) == sh
                 and float(rows.beta[m]) == beta) for h in folds]


def reward_models(cfg: BanditConfig, result: dict[str, Any]) -> dict[str, Any]:
    """‖φ‖ and cos(φ, u*) of the meta-RMs (per s_h and β) and of the BT RM (means over seeds and folds)."""
    u = result["world"].u_star

    def stats(phi: torch.Tensor) -> dict[str, float]:  # phi (S, H, K)
        cos = torch.nn.functional.cosine_similarity(phi, u[:, None].expand_as(phi), dim=-1)
        return {"norm": round(float(phi.norm(dim=-1).mean()), 4), "cos_u_star": round(float(cos.mean()), 4)}

    rows, meta = result["rows"], result["meta"]
    ours = {f"s_h={sh}": {f"β={b:g}": stats(meta.phi[:, table_rows_index(rows, cfg.folds, sh, b)]) for b in cfg.betas}
            for sh in cfg.sh_values}
    return {"ours": ours, "bt": stats(result["phi_bt"])}


def summarise(cfg: BanditConfig, table: Table, methods: list[str]) -> dict[str, Any]:
    """Mean over seeds and folds of every metric, per s_h, protocol and method; fold means of A_PL; chosen β."""
    metric_names = ["apl", "win"] + [f"reward@{t:g}" for t in cfg.temperatures]
    out: dict[str, Any] = {}
    for sh in cfg.sh_values:
        block = {}
        for protocol in table.protocols:
            block[protocol] = {}
            for method in methods:
                apl = table.get(method, sh, protocol)
                entry = {k: round(float(table.get(method, sh, protocol, k).mean()), 4) for k in metric_names}
                entry["apl_sd_over_seeds"] = round(float(apl.mean(1).std(ddof=1)), 4) if cfg.seeds > 1 else 0.0
                entry["apl_per_domain"] = {f"domain {h}": round(float(apl[:, j].mean()), 4)
                                           for j, h in enumerate(cfg.folds)}
                block[protocol][method] = entry
        block["tuned_beta"] = {method: {f"domain {h}": table.beta_of(method, sh, "tuned β")[:, j].tolist()
                                        for j, h in enumerate(cfg.folds)}
                               for method in methods if table.beta_of(method, sh, "tuned β") is not None}
        out[f"s_h={sh}"] = block
    return out


def meta_summary(cfg: BanditConfig, result: dict[str, Any]) -> dict[str, Any]:
    """Per s_h and β: the mean selected step, the outer loss over the first and last 50 steps, skipped steps."""
    meta, rows, out = result["meta"], result["rows"], {}
    for sh in cfg.sh_values:
        for b in cfg.betas:
            sel = (rows.sh == sh) & (rows.beta == b)
            loss = meta.outer_loss[:, :, sel]
            out[f"s_h={sh}, β={b:g}"] = {
                "mean_selected_step": round(float(meta.best_step[:, sel].double().mean()), 1),
                "outer_loss_first_50": round(float(loss[:50].mean()), 4) if len(loss) else None,
                "outer_loss_last_50": round(float(loss[-50:].mean()), 4) if len(loss) else None,
                "skipped_steps": int(meta.skipped[:, sel].sum())}
    return out


def records(cfg: BanditConfig, table: Table, result: dict[str, Any], methods: list[str]) -> list[dict]:
    """Per (method, s_h, protocol, fold, seed) the held-out metrics; per evaluation step of meta-training the mean
    validation A_PL and outer loss per (s_h, β)."""
    rows_out = []
    metric_names = ["apl", "win"] + [f"reward@{t:g}" for t in cfg.temperatures]
    for sh in cfg.sh_values:
        for protocol in table.protocols:
            for method in methods:
                vals = {k: table.get(method, sh, protocol, k) for k in metric_names}
                beta = table.beta_of(method, sh, protocol)
                for j, h in enumerate(cfg.folds):
                    for s in range(cfg.seeds):
                        rows_out.append({"part": "bandit", "method": method, "s_h": sh, "protocol": protocol,
                                         "held_out": h, "seed": s, "beta": None if beta is None else beta[s, j],
                                         **{k: round(float(v[s, j]), 6) for k, v in vals.items()}})
    meta, rows = result["meta"], result["rows"]
    previous = 0
    for e, k in enumerate(meta.eval_steps):
        window = meta.outer_loss[previous:k] if k > previous else None
        for sh in cfg.sh_values:
            for b in cfg.betas:
                sel = (rows.sh == sh) & (rows.beta == b)
                rows_out.append({"part": "bandit", "kind": "meta_training", "step": k, "s_h": sh, "beta": b,
                                 "val_apl": round(float(meta.val_apl[e][:, sel].mean()), 6),
                                 "outer_loss": None if window is None else round(float(window[:, :, sel].mean()), 6)})
        previous = k
    return rows_out

