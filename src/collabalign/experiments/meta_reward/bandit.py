"""Variant A of the meta-learned reward model's reproduction (spec docs/methods/meta-reward.md §8.1, §8.3): the
log-linear multi-domain contextual bandit, leave-one-domain-out, with ours (Algorithms 1 + 2), SFT, BT+RWR, PPO(TR),
PPO(TR+TE), DPO, HPL and Oracle RWR. Two β protocols: one shared β for every method that has one, and β tuned per
method on the training domains' validation pairs. Seeds are the replicates; each cell of an "in every cell" claim is
a held-out domain (× baseline); otherwise values are means over the folds. All runs of a stage are one batched
computation over (seed, fold, s_h, β)."""

from __future__ import annotations

from typing import Any

import numpy as np

from collabalign import claims
from collabalign.claims import tagged
from collabalign.experiments.meta_reward.bandit_methods import BanditConfig, Table, run_methods
from collabalign.experiments.meta_reward.bandit_summary import (
    meta_summary,
    records,
    reward_models,
    summarise,
    table_rows_index,
)
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

CHANCE = 0.5
BASELINES = ("SFT", "BT+RWR", "PPO(TR)", "PPO(TR+TE)", "DPO", "HPL")
PREFERENCE_METHODS = ("BT+RWR", "PPO(TR+TE)", "PPO(TR)", "DPO", "HPL")

OURS_OVER_SFT = claims.superiority(
    "Bandit: ours > SFT on held-out A_PL in every held-out domain",
    "per seed, held-out A_PL (Eq. 26) of ours (Algorithm 1 + converged Algorithm 2) minus SFT's, above 0 in every "
    "held-out domain (Holm over the domains)")
OURS_OVER_ALL = claims.superiority(
    "Bandit: ours > every baseline on every held-out domain (the paper's headline)",
    "per seed, held-out A_PL of ours minus each baseline's (SFT, BT+RWR, PPO(TR), PPO(TR+TE), DPO, HPL), above 0 in "
    "every (held-out domain, baseline) cell (Holm over the cells); the spec predicts a β-dependent outcome at "
    "s_h = 0 and DPO/HPL winning at s_h = 1")
PREFERENCE_OVER_SFT = claims.superiority(
    "Bandit: a preference-using method > SFT on held-out A_PL in every held-out domain",
    "per seed, held-out A_PL of the method minus SFT's, above 0 in every held-out domain (Holm); at s_h = 0 DPO, HPL "
    "and PPO(TR) cannot move the held-out policy (no shared parameters), so a tie is expected there")
PPO_TEST_PROMPTS = claims.superiority(
    "Bandit: PPO(TR+TE) > PPO(TR) on held-out A_PL",
    "per seed, the fold-mean held-out A_PL of PPO(TR+TE) minus PPO(TR), above 0")
LARGER_BETA = claims.superiority(
    "Bandit: larger β gives better held-out A_PL for ours (Fig. 4)",
    "per seed, least-squares slope of the fold-mean held-out A_PL of ours against log β over the β grid, above 0")
RESCALES = claims.superiority(
    "Bandit: the meta-learned reward model rescales with β (spec §8.1 observation, not a paper claim)",
    "per seed, least-squares slope of log ‖φ‖ (fold-mean ‖φ‖ of the selected meta-RM) against log β over the β "
    "grid, above 0")
HYPERGRADIENT = claims.exact(
    "Bandit: the reverse-mode hypergradient equals central finite differences",
    "largest |hypergradient - central finite difference (ε = 1e-5)| relative to max |finite difference| on a small "
    "instance of the bandit (D = check_steps, s_h = 0 and 1, β = 1, float64), at most 1e-6", tolerance=1e-6)
CLAIMS = (OURS_OVER_SFT, OURS_OVER_ALL, PREFERENCE_OVER_SFT, PPO_TEST_PROMPTS, LARGER_BETA, RESCALES, HYPERGRADIENT)


def decide(cfg: BanditConfig, table: Table, result: dict[str, Any]) -> list[dict]:
    """Every declared claim, in every setting the config runs."""
    out, domains = [], [f"domain {h}" for h in cfg.folds]
    means = lambda a: {d: float(a[:, j].mean()) for j, d in enumerate(domains)}  # noqa: E731
    for sh in cfg.sh_values:
        for protocol in table.protocols:
            tag = f"s_h={sh}, {protocol}"
            ours, sft_ = table.get("ours", sh, protocol), table.get("SFT", sh, protocol)
            if sh == 0:
                out.append(tagged(OURS_OVER_SFT, tag).decide_cells(
                    {d: (ours[:, j], sft_[:, j]) for j, d in enumerate(domains)}, ours=means(ours), sft=means(sft_),
                    chance=CHANCE))
            cells, context = {}, {"ours": means(ours)}
            for base in BASELINES:
                b = table.get(base, sh, protocol)
                context[base] = means(b)
                cells |= {f"{d} vs {base}": (ours[:, j], b[:, j]) for j, d in enumerate(domains)}
            out.append(tagged(OURS_OVER_ALL, tag).decide_cells(cells, **context))
            for method in PREFERENCE_METHODS:
                a = table.get(method, sh, protocol)
                out.append(tagged(PREFERENCE_OVER_SFT, f"{tag}, {method}").decide_cells(
                    {d: (a[:, j], sft_[:, j]) for j, d in enumerate(domains)}, method=means(a), sft=means(sft_)))
            te, tr = table.get("PPO(TR+TE)", sh, protocol).mean(1), table.get("PPO(TR)", sh, protocol).mean(1)
            out.append(tagged(PPO_TEST_PROMPTS, tag).decide(te, tr, tr_te=float(te.mean()), tr=float(tr.mean())))
        out += beta_claims(cfg, table, result, sh)
    check = result["check"]
    out.append(tagged(HYPERGRADIENT, f"D={cfg.check_steps}").decide(check["relative_error"], 0.0, **check))
    return out


def beta_claims(cfg: BanditConfig, table: Table, result: dict[str, Any], sh: int) -> list[dict]:
    """The β sweep of ours: held-out A_PL and ‖φ‖ against log β."""
    tag, grid = f"s_h={sh}", cfg.beta_grid
    if len(set(grid)) < 2:
        return [claims.not_run(tagged(c, tag), "the β grid has fewer than two values") for c in (LARGER_BETA, RESCALES)]
    apl = np.stack([_ours_at(table, sh, b) for b in grid], 1)
    norms = np.stack([_phi_norm(cfg, result, sh, b).mean(1) for b in grid], 1)
    apl_slopes = claims.slopes(grid, apl, log_x=True, log_y=False)
    norm_slopes = claims.slopes(grid, norms, log_x=True, log_y=True)
    rest = [i for i, b in enumerate(grid) if b > min(grid)]  # sensitivity: the sweep without its smallest β
    context = {}
    if len({grid[i] for i in rest}) >= 2:
        iv = claims.interval(claims.slopes([grid[i] for i in rest], apl[:, rest], log_x=True, log_y=False))
        context["slope_without_smallest_beta"] = {"estimate": iv.estimate, "interval": [iv.low, iv.high]}
    return [tagged(LARGER_BETA, tag).decide(apl_slopes, 0.0, betas=grid, apl=apl.mean(0).tolist(), **context),
            tagged(RESCALES, tag).decide(norm_slopes, 0.0, betas=grid, phi_norm=norms.mean(0).tolist())]


def _ours_at(table: Table, sh: int, beta: float) -> np.ndarray:
    """(S,) fold-mean held-out A_PL of ours at one β."""
    m = table.methods["ours"]
    idx = [m.index(h, sh, beta) for h in table.cfg.folds]
    return m.values["apl"][:, idx].numpy().mean(1)


def _phi_norm(cfg: BanditConfig, result: dict[str, Any], sh: int, beta: float) -> np.ndarray:
    """(S, H) ‖φ‖ of the selected meta-RM."""
    m = table_rows_index(result["rows"], cfg.folds, sh, beta)
    return result["meta"].phi[:, m].norm(dim=-1).numpy()


def part(cfg: BanditConfig, seeds: Seeds, run_dir: RunDir, progress: bool = True) -> Part:
    """Runs every method, decides the declared claims, returns metrics, records and notes."""
    result = run_methods(cfg, seeds, progress)
    table = Table(cfg, result["methods"])
    decided = decide(cfg, table, result)
    methods = ["ours", "ours (matched)", *BASELINES, "oracle RWR", "BT+RWR (matched)", "oracle RWR (matched)"]
    summary = summarise(cfg, table, methods)
    meta = result["meta"]
    total = round(sum(result["seconds"].values()), 1)
    sft_apl = float(table.get("SFT", cfg.sh_values[0], "tuned β").mean())  # s_h = first of sh_values
    metrics = {"bandit": {"table": summary, "chance_apl": CHANCE, "sft_apl": round(sft_apl, 4),
                          "reward_models": reward_models(cfg, result), "hypergradient_check": result["check"],
                          "meta_training": meta_summary(cfg, result),
                          "seconds": result["seconds"]}}
    sh0 = cfg.sh_values[0]
    learned = "; ".join(f"{p}: " + ", ".join(f"{m} {float(table.get(m, sh0, p).mean()):.3f}"
                                             for m in ("ours", "BT+RWR")) for p in table.protocols)
    note = (f"Bandit (spec §8.1): {cfg.n_dom} domains, {cfg.candidates} candidates, 𝒟^T {cfg.sft_prompts}×"
            f"{cfg.sft_responses}, {cfg.pl_prompts} pair prompts (ties dropped), {cfg.val_prompts} validation and "
            f"{cfg.test_prompts} test prompts per domain; {cfg.seeds} seeds × held-out domains {cfg.folds}. Ours: "
            f"K = {cfg.outer_steps}, D = {cfg.inner_steps}, α = {cfg.alpha}, B_in = {cfg.inner_batch}, η = {cfg.eta} "
            f"(SGD, per-replicate clip {cfg.clip}), B_out = {cfg.outer_batch}, φ selected every {cfg.eval_every} steps "
            f"by validation A_PL of the D-step policy on the training domains; meta-test N_test = {cfg.test_steps} "
            f"steps with the minimum-training-loss checkpoint (headline) and D steps (matched). λ = "
            f"{cfg.weight_decay} on every policy objective; PPO/DPO/HPL {cfg.baseline_steps} full-batch steps of "
            f"{cfg.baseline_lr} (PPO scaled by 1/max(1, β), DPO by 1/β²). Shared β: {cfg.shared_betas}; tuned β: "
            f"argmax over {cfg.beta_grid} of the validation A_PL on the training domains (policy stage applied to "
            f"each training domain; no held-out labels). Chance A_PL is {CHANCE}; SFT's held-out A_PL (s_h = {sh0}) is "
            f"{sft_apl:.3f}; learned (s_h = {sh0}, mean held-out A_PL): {learned}. "
            f"Skipped non-finite outer steps: {int(meta.skipped.sum())}. Runtime {total} s on one core "
            f"({result['seconds']}).")
    return Part(claims=decided, records=records(cfg, table, result, methods), metrics=metrics, notes=[note])
