"""The pessimistic-policy part (spec §8.3; Alg. 1 steps 2–3, Thm 4.2 / Cor 4.1): every reward estimator is trained
on skewed comparisons in an H = 1 bandit built on the §8.1 truth, then each user's pessimistic policy is solved for
every confidence radius zeta and its value gap J(pi*_i; r*_i) - J(pi^_i; r*_i) measured. Claims on the average gap
over users, paired over seeds; every P-ShareLoRA variant is tested against every baseline (Holm), none picked."""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from collabalign.claims import Claim, not_run, slopes, superiority
from collabalign.experiments.pshare_lora.config import BanditConfig, Config, Zeta
from collabalign.experiments.pshare_lora.plots import bandit_plots
from collabalign.experiments.pshare_lora.problems.bandit import (
    Bandit,
    bandit_pairs,
    first_pairs,
    make_bandit,
    pessimistic_policy,
    rewards,
    theory_zeta,
    value_gap,
)
from collabalign.experiments.pshare_lora.problems.synthetic import (
    ProblemConfig,
    TrainConfig,
    Truth,
    effective_delta,
    fit_model,
    generate,
)
from collabalign.methods.pshare_lora import LABELS, Prefs
from collabalign.runs import Part, RunDir, cached_json, fingerprint
from collabalign.seeding import Seeds

OURS = ("pshare_si", "pshare_g")
BASELINES = ("global", "local", "full", "share_rep", "share_a")
GAP = "average value gap over users at zeta = 0, paired over seeds"
LOWEST_GAP = {m: superiority(
    f"{LABELS[m]} has a lower value gap than every baseline", f"{GAP}: {LABELS[m]} below each baseline that ran, "
    "Holm over the baselines; one claim per N_p (spec §8.3: P-ShareLoRA lowest at small N_p)", lower_is_better=True)
    for m in OURS}
PESSIMISM_HELPS = superiority(
    "A confidence radius zeta > 0 lowers the value gap vs zeta = 0", "at the smallest N_p, the value gap averaged "
    "over the estimators and users, paired over seeds; one claim per zeta > 0 (spec §8.3 / §7 item 4: when coverage "
    "is poor)", lower_is_better=True)
GAP_FALLS = {m: superiority(
    f"{LABELS[m]}'s value gap falls with N_p (zeta = 0)", "log-log slope of the average gap against N_p fitted per "
    "seed, below 0 (Thm 4.2 / Cor 4.1; the bound's rate -1/2 is an upper bound)", lower_is_better=True) for m in OURS}


def zeta_label(z: Zeta) -> str:
    """'0', '0.01', 'theory', 'oracle'."""
    return z if isinstance(z, str) else f"{z:g}"


def fit_deltas(tc: TrainConfig, problem: ProblemConfig, truth: Truth, data: Prefs, method: str, seed: int) -> Tensor:
    """Trains `method` on the bandit comparisons and returns every Delta^_i, (N, d1, d2)."""
    net, _ = fit_model(truth, data, problem, tc, method, Seeds(seed).torch(f"bandit-train-{method}"))
    return effective_delta(net, problem.users)


def radii(cfg: BanditConfig, k: int, truth: Truth, delta_hat: Tensor, n_train: int) -> dict[str, Tensor]:
    """zeta per user (N,) for every configured value: fixed, theory-like, or the oracle ||Delta^_i - Delta*_i||_F^2."""
    n = truth.delta.shape[0]
    out = {}
    for z in cfg.zetas:
        if z == "oracle":
            value = (delta_hat.double() - truth.delta.double()).square().sum(dim=(1, 2))
        else:
            value = torch.full((n,), theory_zeta(truth, k, n_train) if z == "theory" else float(z),
                               dtype=torch.float64)
        out[zeta_label(z)] = value
    return out


def policy_gaps(cfg: BanditConfig, truth: Truth, bandit: Bandit, delta_hat: Tensor,
                zetas: dict[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """Per zeta label: every user's value gap and the policy mass on uncovered candidates, both (N,); one solve
    batched over users x zeta values."""
    z, n = len(zetas), truth.delta.shape[0]
    theta_hat = (truth.theta_init + delta_hat).double().repeat(z, 1, 1)
    pi, _ = pessimistic_policy(theta_hat, bandit, torch.cat(list(zetas.values())), cfg.iters, cfg.step)
    theta = (truth.theta_init + truth.delta).double().repeat(z, 1, 1)
    gap = value_gap(theta, bandit, pi).view(z, n)
    uncovered = (pi * (~bandit.covered)).sum(dim=-1).mean(dim=-1).view(z, n)
    return {label: (gap[j], uncovered[j]) for j, label in enumerate(zetas)}


def reference(truth: Truth, bandit: Bandit) -> dict[str, float]:
    """The gap of mu_ref itself and how often a user's best response is a candidate the data never show."""
    theta = (truth.theta_init + truth.delta).double()
    k = bandit.covered.shape[1]
    gap = value_gap(theta, bandit, torch.full((theta.shape[0], *bandit.covered.shape), 1.0 / k, dtype=torch.float64))
    best = rewards(theta, bandit).argmax(dim=-1)  # (N, S)
    hidden = ~bandit.covered.gather(1, best.T).T
    return {"reference_gap": round(float(gap.mean()), 6), "optimum_uncovered": round(float(hidden.double().mean()), 4)}


def seed_records(cfg: BanditConfig, p: ProblemConfig, seed: int, progress: bool) -> list[dict]:
    """Every estimator x N_p x zeta record of one seed, plus its reference record."""
    truth, _, _ = generate(p, seed)
    bandit = make_bandit(p.d1, p.d2, cfg.prompts, cfg.candidates, cfg.coverage, Seeds(seed).torch("pshare-bandit"))
    pool = bandit_pairs(bandit, truth, max(cfg.n_train), Seeds(seed).torch("pshare-bandit-pairs"))
    out = [{"experiment": "bandit_reference", "seed": seed, **reference(truth, bandit)}]
    for n_train in cfg.n_train:
        data = first_pairs(pool, p.users, n_train)
        for method in cfg.methods:
            delta_hat = fit_deltas(cfg.train, p, truth, data, method, seed)
            zetas = radii(cfg, p.k, truth, delta_hat, n_train)
            error = float((delta_hat - truth.delta).square().sum(dim=(1, 2)).mean())
            for label, (gap, uncovered) in policy_gaps(cfg, truth, bandit, delta_hat, zetas).items():
                out.append({"experiment": "bandit", "seed": seed, "n_train": n_train, "method": method, "zeta": label,
                            "zeta_value": round(float(zetas[label].mean()), 6), "gap": round(float(gap.mean()), 6),
                            "gap_per_user": [round(float(x), 5) for x in gap],
                            "uncovered_mass": round(float(uncovered.mean()), 5), "param_error": round(error, 5)})
        if progress:
            zero = {r["method"]: r["gap"] for r in out if r.get("n_train") == n_train and r.get("zeta") == "0"}
            print(f"bandit seed {seed} N_p {n_train}: gap at zeta 0 {zero}", file=sys.stderr)
    return out


Curves = dict[str, dict[str, dict[int, list[float]]]]  # method -> zeta label -> N_p -> average gap per seed


def curves_of(records: list[dict]) -> Curves:
    """Average gap per seed (in seed order) for every method, zeta and N_p."""
    out: Curves = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in records:
        if r["experiment"] == "bandit":
            out[r["method"]][r["zeta"]][r["n_train"]].append(r["gap"])
    return out


def at(claim: Claim, suffix: str) -> Claim:
    """The declared claim, its name completed with the setting it is decided at."""
    return replace(claim, name=f"{claim.name} {suffix}")


def estimator_claims(curves: Curves, n_train: list[int]) -> list[dict]:
    """(a) At every N_p (the spec's claim is the smallest), each P-ShareLoRA variant against every baseline."""
    rivals = [m for m in BASELINES if m in curves]
    out = []
    for n in sorted(n_train):
        for m in OURS:
            claim = at(LOWEST_GAP[m], f"at N_p = {n} (zeta = 0)")
            if m not in curves or not rivals:
                absent = LABELS[m] if m not in curves else "any baseline"
                out.append(not_run(claim, f"not in this run's methods: {absent}"))
                continue
            gap = {r: curves[r]["0"][n] for r in (m, *rivals)}
            out.append(claim.decide_cells({LABELS[r]: (gap[m], gap[r]) for r in rivals},
                                          mean_gap={LABELS[r]: np.mean(g) for r, g in gap.items()}))
    return out


def pessimism_claims(curves: Curves, n0: int, coverage: float) -> list[dict]:
    """(b) Each zeta > 0 lowers the gap (mean over the estimators, paired over seeds) at the smallest N_p."""
    methods = sorted(curves)
    labels = [z for z in curves[methods[0]] if z != "0"]
    mean_gap = {z: np.mean([curves[m][z][n0] for m in methods], axis=0) for z in ["0", *labels]}
    return [at(PESSIMISM_HELPS, f"at zeta = {z}, N_p = {n0}").decide(
        mean_gap[z], mean_gap["0"], coverage=coverage, gap=mean_gap[z].mean(), gap_zeta0=mean_gap["0"].mean())
        for z in labels]


def gap_slopes(curves: Curves, n_train: list[int]) -> dict[str, np.ndarray]:
    """Per method, the log-log slope of the gap against N_p at zeta = 0, one per seed."""
    xs = sorted(n_train)
    return {m: slopes(xs, np.maximum(np.array([c["0"][n] for n in xs]).T, 1e-12)) for m, c in curves.items()}


def slope_claims(per_seed: dict[str, np.ndarray], n_train: list[int]) -> list[dict]:
    """(c) The P-ShareLoRA gaps fall with N_p: per-seed log-log slopes at zeta = 0 below 0."""
    return [GAP_FALLS[m].decide(per_seed[m], 0.0, n_train=sorted(n_train)) if m in per_seed and len(n_train) > 1
            else not_run(GAP_FALLS[m], f"needs {LABELS[m]} at 2 N_p or more in this run") for m in OURS]


def gap_table(curves: Curves, methods: list[str], n_train: list[int], ref: float) -> str:
    """Markdown: mean ± std over seeds of the average value gap, one row per estimator x zeta, one column per N_p."""
    xs = sorted(n_train)
    lines = [f"Pessimistic policy value gap J(pi*; r*) - J(pi^; r*), average over users, mean ± std over seeds "
             f"(mu_ref's gap {ref:.3f}):", "", "| estimator | zeta | " + " | ".join(f"N_p = {n}" for n in xs) + " |",
             "|---|---|" + "---|" * len(xs)]
    for m in methods:
        for z, by_n in curves[m].items():
            cells = [f"{np.mean(by_n[n]):.4f} ± {np.std(by_n[n]):.4f}" for n in xs]
            lines.append(f"| {LABELS[m]} | {z} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_of(records: list[dict], key: str, **match: object) -> float:
    """Mean of `key` over the records whose fields equal `match`, rounded to 4 digits."""
    return round(float(np.mean([r[key] for r in records if all(r.get(k) == v for k, v in match.items())])), 4)


def bandit_part(cfg: Config, run_dir: RunDir, progress: bool) -> Part:
    """Trains every estimator per (seed, N_p) on the bandit's comparisons (on the main problem's truth), solves the
    pessimistic policies for every zeta and returns the records, claims (a)–(c), the gap table and plots. Each seed's
    records are cached in run_dir/pshare_bandit_runs, so a stopped run continues where it stopped."""
    key = fingerprint({"bandit": cfg.bandit.model_dump(mode="json", exclude={"run"}),
                       "problem": cfg.problem.model_dump(mode="json")})
    records = [r for seed in cfg.seeds for r in cached_json(
        run_dir.path / "pshare_bandit_runs" / f"seed{seed}.json", key,
        lambda seed=seed: {"records": seed_records(cfg.bandit, cfg.problem, seed, progress)})["records"]]
    return summarise(cfg.bandit, records, run_dir)


def summarise(cfg: BanditConfig, records: list[dict], run_dir: RunDir) -> Part:
    """Claims, metrics, table and plots from the bandit records (also rebuilds them from a run's metrics.jsonl)."""
    records = [r for r in records if r["experiment"] in ("bandit", "bandit_reference")]
    curves = curves_of(records)
    refs = [r for r in records if r["experiment"] == "bandit_reference"]
    per_seed = gap_slopes(curves, cfg.n_train) if len(cfg.n_train) > 1 else {}
    claims = estimator_claims(curves, cfg.n_train) + pessimism_claims(curves, min(cfg.n_train), cfg.coverage)
    claims += slope_claims(per_seed, cfg.n_train)
    best = bandit_plots(run_dir, curves)
    theory = {str(n): mean_of(records, "zeta_value", zeta="theory", n_train=n) for n in cfg.n_train
              if "theory" in cfg.zetas}
    ref_gap = mean_of(refs, "reference_gap")
    metrics = {"gap": {LABELS[m]: {z: {str(n): round(float(np.mean(v)), 4) for n, v in by_n.items()}
                                   for z, by_n in c.items()} for m, c in curves.items()},
               "slope_zeta0": {LABELS[m]: round(float(s.mean()), 3) for m, s in per_seed.items()},
               "best_zeta": best, "theory_zeta": theory, "reference_gap": ref_gap,
               "optimum_uncovered": mean_of(refs, "optimum_uncovered")}
    notes = [gap_table(curves, cfg.methods, cfg.n_train, ref_gap),
             f"Bandit (spec §8.3): S = {cfg.prompts} prompts x K = {cfg.candidates} candidates, comparisons over "
             f"{cfg.coverage:g} of each prompt's candidates (a user's best response is uncovered in "
             f"{metrics['optimum_uncovered']:.0%} of prompts), mu_ref uniform; {cfg.train.steps} full-batch Adam "
             f"steps per estimator, {cfg.iters} exponentiated-gradient iterations per policy. The confidence set is a "
             "Frobenius ball around Delta^_i (eq. 3.4): its penalty sqrt(zeta) ||M_pi||_F does not know which "
             "candidates the data cover, so zeta > 0 pulls the policy towards mu_ref on every prompt alike."]
    return Part(claims=claims, records=records, metrics={"bandit": metrics}, notes=notes)
