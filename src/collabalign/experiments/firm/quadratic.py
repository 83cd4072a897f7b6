"""R1 of the FIRM reproduction (spec §8 R1): FIRM's β sweep against FedCMOO-A, FedAvg-LS and FMOL on the synthetic
federated quadratic at two noise levels, the M = 3 variant, the preference sweep, and the exact upload bytes of each
method from its Message objects. Seeds (replicates of the noise) are simulated together; every arm has its own noise
stream, and arms are paired by replicate index."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Distinct, Grid, Probability, Strict
from collabalign.experiments.firm import plots
from collabalign.experiments.firm.common import last_mean, preference, summary
from collabalign.experiments.firm.problems.quadratic import Quadratic, Setting, simulate
from collabalign.methods.firm.rules import Rule, Traffic
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

DISPERSION = claims.superiority(
    "R1: λ dispersion falls as β grows in the noisy regime",
    "per-seed least-squares slope of log D_λ (mean over all local steps) against log β over the positive β of the "
    "sweep, at the noisy σ, below 0", lower_is_better=True)
DRIFT = claims.superiority(
    "R1: the exact disagreement drift T^disagr falls as β grows in the noisy regime",
    "per-seed slope of log T^disagr (mean over all local steps) against log β over the positive β, at the noisy σ, "
    "below 0", lower_is_better=True)
FLOORS = claims.equivalence(
    "R1: FIRM and the baseline reach similar stationarity floors",
    "per-seed ratio of the Pareto stationarity min_λ ‖∇J(θ̄)λ‖² (mean over the last rounds) FIRM(β = 0.01) / "
    "baseline within a factor 1.5", margin=0.5, scale="ratio")
BALANCE = claims.superiority(
    "R1: larger β moves the end point towards the balanced point",
    "per-seed imbalance abs(f_1 − f_2) of the final model lower at the largest β than at β = 0, at every σ (Holm)",
    lower_is_better=True)
PREFERENCE = claims.superiority(
    "R1: the preference vector steers the end point monotonically",
    "per-seed f_2 − f_1 of the final model rises between every pair of adjacent p_1/p_2 (p_1 + p_2 = 2), Holm over "
    "the pairs")
BYTES_FIRM = claims.exact(
    "R1: FIRM uploads d floats per client per round",
    "float32 array bytes uploaded per client and round, summed from FIRM's Message objects: exactly 4d")
BYTES_FEDCMOO = claims.exact(
    "R1: FedCMOO-A uploads M·d floats per client per round more than FIRM",
    "FedCMOO-A's uploaded array bytes per client and round minus FIRM's: exactly 4Md (its M gradients at θ_t; it "
    "also downloads M floats of λ)")
BYTES_FMOL = claims.exact(
    "R1: FMOL uploads K·M·d floats per client per round more than FIRM",
    "FMOL's uploaded array bytes per client and round minus FIRM's: exactly 4KMd (M gradients at every local step)")


class QuadraticConfig(Strict):
    run: bool = True
    seeds: PositiveInt = 10
    clients: PositiveInt = 8
    d: PositiveInt = 20
    rounds: PositiveInt = 40
    local_steps: PositiveInt = 5
    alpha: PositiveFloat = 0.02
    batch: PositiveInt = 16
    rho_noise: Probability = 0.5
    sigmas: Grid[NonNegativeFloat] = [0.5, 2.0]
    noisy_sigma: NonNegativeFloat = 2.0
    betas: Grid[NonNegativeFloat] = [0.0, 0.01, 0.05, 0.1, 0.5, 1.0]
    firm_beta: NonNegativeFloat = 0.01
    baselines: Distinct[Literal["fedcmoo", "ls", "fmol"]] = ["fedcmoo", "ls", "fmol"]
    three_objectives: bool = True  # the M = 3 variant at the noisy σ
    preference_ratios: Grid[PositiveFloat] = [0.1, 0.5, 1.0, 2.0, 10.0]
    preference_sigma: NonNegativeFloat = 0.5
    preference_rounds: PositiveInt = 60
    floor_window: PositiveInt = 5
    extras: Distinct[Literal["conflict", "hetero"]] = ["conflict", "hetero"]  # β sweeps at the noisy σ, no claims
    hetero: NonNegativeFloat = 0.1

    @model_validator(mode="after")
    def _firm_in_sweep(self) -> QuadraticConfig:
        if self.firm_beta not in self.betas:
            raise ValueError(f"firm_beta = {self.firm_beta} must be one of betas {self.betas}")
        return self


def rules(cfg: QuadraticConfig) -> list[Rule]:
    return [Rule("firm", beta=b) for b in cfg.betas] + [Rule(kind) for kind in cfg.baselines]


def setting(cfg: QuadraticConfig, sigma: float, rounds: int | None = None) -> Setting:
    return Setting(rounds or cfg.rounds, cfg.local_steps, cfg.alpha, cfg.batch, sigma, cfg.rho_noise)


def sweep(cfg: QuadraticConfig, seeds: Seeds, tag: str, problem: Quadratic, st: Setting, arms: list[Rule],
          ledgers: dict | None = None) -> dict[str, dict]:
    """Every arm on one problem; `ledgers` (when given) collects the traffic of FIRM(firm_beta) and the baselines
    (replicate 0)."""
    out = {}
    tracked = {Rule("firm", beta=cfg.firm_beta).label} | {Rule(kind).label for kind in cfg.baselines}
    for rule in arms:
        traffic = Traffic() if ledgers is not None and rule.label in tracked else None
        out[rule.label] = simulate(problem, rule, st, seeds.numpy(f"firm/r1/{tag}/{rule.label}"), traffic)
        if traffic is not None:
            ledgers[rule.label] = traffic
    return out


def records(tag: str, runs: dict[str, dict]) -> list[dict]:
    """Per round and arm: replicate means of every curve."""
    rows = []
    for label, r in runs.items():
        for t in range(len(r["stationarity"])):
            row = {"part": "r1", "setting": tag, "method": label, "round": t + 1}
            row.update({k: float(r[k][t].mean()) for k in ("stationarity", "stationarity_lambda_bar", "dispersion",
                                                            "disagreement", "volatility", "model_dispersion")})
            row.update({f"f{j + 1}": float(v) for j, v in enumerate(r["values"][t].mean(0))})
            rows.append(row)
    return rows


def beta_slopes(cfg: QuadraticConfig, runs: dict[str, dict], key: str) -> np.ndarray:
    """Per-seed slope of log (mean over steps of `key`) against log β over the positive β."""
    betas = [b for b in cfg.betas if b > 0]
    y = np.stack([runs[Rule("firm", beta=b).label][key].mean(0) for b in betas], 1)  # (S, betas)
    return claims.slopes(betas, y)


def arm_metrics(cfg: QuadraticConfig, problem: Quadratic, runs: dict[str, dict]) -> dict[str, dict]:
    front = problem.front()
    out = {}
    for label, r in runs.items():
        final = r["values"][-1]
        gap = np.linalg.norm(final[:, None] - front, axis=-1).min(1)
        out[label] = {"dispersion": float(r["dispersion"].mean()), "disagreement": float(r["disagreement"].mean()),
                      "volatility": float(r["volatility"].mean()),
                      "stationarity_floor": float(last_mean(r["stationarity"], cfg.floor_window).mean()),
                      "final_f": final.mean(0).tolist(), "distance_to_front": float(gap.mean())}
    return out


def part(cfg: QuadraticConfig, seeds: Seeds, run_dir: RunDir, progress: bool = True) -> Part:
    """Both noise levels, the M = 3 variant, the preference sweep and the extras: records, claims, plots, ledger."""
    S, decided, rows, metrics = cfg.seeds, [], [], {}
    ledgers: dict[int, dict[str, Traffic]] = {2: {}, 3: {}}
    firm_label = Rule("firm", beta=cfg.firm_beta).label
    by_sigma, problems = {}, {}
    for sigma in cfg.sigmas:
        problem = Quadratic(S, cfg.clients, 2, cfg.d)
        tag = f"sigma={sigma:g}"
        runs = sweep(cfg, seeds, tag, problem, setting(cfg, sigma), rules(cfg),
                     ledgers[2] if sigma == cfg.sigmas[0] else None)
        by_sigma[sigma], problems[sigma] = runs, problem
        rows += records(tag, runs)
        metrics[tag] = arm_metrics(cfg, problem, runs)
        decided += floors(cfg, tag, runs, firm_label)
        if progress:
            print(f"firm r1: sigma = {sigma:g} done", flush=True)
    settings = {"M=2": by_sigma.get(cfg.noisy_sigma)}
    if cfg.three_objectives:
        m3 = Quadratic(S, cfg.clients, 3, cfg.d)
        settings["M=3"] = sweep(cfg, seeds, "M=3", m3, setting(cfg, cfg.noisy_sigma), rules(cfg), ledgers[3])
        rows += records(f"M=3, sigma={cfg.noisy_sigma:g}", settings["M=3"])
        metrics["M=3"] = arm_metrics(cfg, m3, settings["M=3"])
    for name, runs in settings.items():
        if runs is None:
            decided += [claims.not_run(tagged(c, name), f"the noisy σ {cfg.noisy_sigma:g} is not among the sigmas")
                        for c in (DISPERSION, DRIFT)]
            continue
        for claim, key in ((DISPERSION, "dispersion"), (DRIFT, "disagreement")):
            slopes = beta_slopes(cfg, runs, key)
            decided.append(tagged(claim, f"{name}, sigma={cfg.noisy_sigma:g}").decide(
                slopes, 0.0, slopes=summary(slopes), betas=[b for b in cfg.betas if b > 0],
                means={f"{b:g}": float(runs[Rule("firm", beta=b).label][key].mean()) for b in cfg.betas}))
    decided.append(balance(cfg, by_sigma))
    pref_runs, pref_problem = preference_sweep(cfg, seeds)
    decided.append(steering(cfg, pref_runs))
    rows += records(f"preference, sigma={cfg.preference_sigma:g}", pref_runs)
    metrics["preference"] = arm_metrics(cfg, pref_problem, pref_runs)
    for M, led in ledgers.items():
        if led:
            decided += byte_claims(cfg, led, M)
    extras = {}
    for extra in cfg.extras:
        problem = Quadratic(S, cfg.clients, 2, cfg.d, start="conflict" if extra == "conflict" else "valley",
                            hetero=cfg.hetero if extra == "hetero" else 0.0, rng=seeds.numpy("firm/r1/hetero"))
        runs = sweep(cfg, seeds, extra, problem, setting(cfg, cfg.noisy_sigma), rules(cfg))
        extras[extra] = {"dispersion_slope": summary(beta_slopes(cfg, runs, "dispersion")),
                         **arm_metrics(cfg, problem, runs)}
    metrics["extras"] = extras
    run_dir.write_ledgers({f"r1 M={M} {label}": t.ledger for M, led in ledgers.items() for label, t in led.items()})
    plots.r1(run_dir.path / "plots", cfg, by_sigma, problems, pref_runs, pref_problem, settings)
    note = (f"R1 (spec §8): d = {cfg.d}, C = {cfg.clients}, T = {cfg.rounds}, K = {cfg.local_steps}, α = {cfg.alpha}, "
            f"B = {cfg.batch}, ρ_n = {cfg.rho_noise}, {S} seeds; start (0, 5, …, 5); FIRM with trace-normalised Ĝ; "
            "FedCMOO-A solves an exact β = 0 MGDA once per round on a separate batch at θ_t; FMOL at every local step. "
            f"Floors: mean of min_λ ‖∇J(θ̄)λ‖² over the last {cfg.floor_window} rounds. Bytes: ledger.csv "
            "(replicate 0, serialised Message bytes).")
    return Part(claims=decided, records=rows, metrics={"r1": metrics}, notes=[note])


def floors(cfg: QuadraticConfig, tag: str, runs: dict[str, dict], firm_label: str) -> list[dict]:
    """FIRM(firm_beta) against every baseline on the stationarity floor."""
    firm = last_mean(runs[firm_label]["stationarity"], cfg.floor_window)
    out = []
    for kind in cfg.baselines:
        base = last_mean(runs[Rule(kind).label]["stationarity"], cfg.floor_window)
        out.append(tagged(FLOORS, f"{tag}, vs {Rule(kind).label}").decide(
            firm, base, firm=summary(firm), baseline=summary(base), window=cfg.floor_window))
    return out


def balance(cfg: QuadraticConfig, by_sigma: dict[float, dict]) -> dict:
    """|f1 − f2| at the largest β against β = 0, one cell per σ."""
    hi, lo = Rule("firm", beta=max(cfg.betas)).label, Rule("firm", beta=0.0).label
    if 0.0 not in cfg.betas or max(cfg.betas) <= 0:
        return claims.not_run(BALANCE, "the β sweep needs 0 and a positive β")
    imbalance = {s: {k: np.abs(r[k]["values"][-1, :, 0] - r[k]["values"][-1, :, 1]) for k in (hi, lo)}
                 for s, r in by_sigma.items()}
    return BALANCE.decide_cells({f"sigma={s:g}": (v[hi], v[lo]) for s, v in imbalance.items()},
                                imbalance={f"sigma={s:g}": {k: float(x.mean()) for k, x in v.items()}
                                           for s, v in imbalance.items()})


def preference_sweep(cfg: QuadraticConfig, seeds: Seeds) -> tuple[dict[str, dict], Quadratic]:
    problem = Quadratic(cfg.seeds, cfg.clients, 2, cfg.d)
    arms = [Rule("firm", p=preference(r)) for r in cfg.preference_ratios]
    st = setting(cfg, cfg.preference_sigma, cfg.preference_rounds)
    runs = sweep(cfg, seeds, f"preference sigma={cfg.preference_sigma:g}", problem, st, arms)
    return {f"p1/p2={r:g}": runs[a.label] for r, a in zip(cfg.preference_ratios, arms, strict=True)}, problem


def steering(cfg: QuadraticConfig, runs: dict[str, dict]) -> dict:
    """f2 − f1 of the final model between adjacent preference ratios (sorted)."""
    ratios = sorted(cfg.preference_ratios)
    if len(ratios) < 2:
        return claims.not_run(PREFERENCE, "fewer than two preference ratios")
    trade = {r: runs[f"p1/p2={r:g}"]["values"][-1, :, 1] - runs[f"p1/p2={r:g}"]["values"][-1, :, 0] for r in ratios}
    cells = {f"{a:g} -> {b:g}": (trade[b], trade[a]) for a, b in zip(ratios, ratios[1:], strict=False)}
    finals = {f"{r:g}": runs[f"p1/p2={r:g}"]["values"][-1].mean(0).tolist() for r in ratios}
    return PREFERENCE.decide_cells(cells, final_f=finals, sigma=cfg.preference_sigma, rounds=cfg.preference_rounds)


def byte_claims(cfg: QuadraticConfig, ledgers: dict[str, Traffic], M: int) -> list[dict]:
    """Uploaded array bytes per client and round of FIRM, FedCMOO-A and FMOL against the formulas."""
    per = cfg.clients * cfg.rounds
    firm = ledgers.get(Rule("firm", beta=cfg.firm_beta).label)
    tag = f"M={M}, d={cfg.d}"
    if firm is None:
        return [claims.not_run(tagged(c, tag), f"firm_beta {cfg.firm_beta:g} is not in the β sweep")
                for c in (BYTES_FIRM, BYTES_FEDCMOO, BYTES_FMOL)]
    up = {label: t.payload["up"] / per for label, t in ledgers.items()}
    down = {label: t.payload["down"] / per for label, t in ledgers.items()}
    wire = {label: t.ledger.total("up") / per for label, t in ledgers.items()}
    context = {"up_array_bytes": up, "down_array_bytes": down, "up_wire_bytes": wire}
    out = [tagged(BYTES_FIRM, tag).decide(firm.payload["up"] / per, 4 * cfg.d, **context)]
    for claim, label, expected in ((BYTES_FEDCMOO, "fedcmoo-a", 4 * M * cfg.d),
                                   (BYTES_FMOL, "fmol", 4 * cfg.local_steps * M * cfg.d)):
        if label in up:
            out.append(tagged(claim, tag).decide(up[label] - firm.payload["up"] / per, expected, **context))
        else:
            out.append(claims.not_run(tagged(claim, tag), f"{label} is not among the baselines"))
    return out
