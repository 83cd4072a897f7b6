"""The §8.2 theory sweeps on the §8.1 problem: data per user, number of users, ν and the tail. Every rate is a
log-log slope fitted per seed (`claims.slopes`) and decided against the band declared below; the crossover, the
plateau and the error trends are per-seed statistics too. The bands are the ones fixed before the first main run,
except the MSE plateau, added after its results were seen (post hoc)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from collabalign.claims import equivalence, in_band, not_run, slopes, superiority
from collabalign.experiments.pshare_lora.config import Config, SweepConfig
from collabalign.experiments.pshare_lora.plots import sweep_plot
from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig
from collabalign.methods.pshare_lora import LABELS
from collabalign.runs import Part, RunDir

PER_SEED = "log-log slope fitted per seed"
DIST_RATE_NP = in_band("dist(B^, B°) falls as N_p^-1/2 (Thm 4.1)", f"P-ShareLoRA (SI), eta = 0: {PER_SEED} against "
                       "N_p in [-0.75, -0.25] (-0.5 ± half)", -0.75, -0.25)
MSE_RATE_NP = in_band("P-ShareLoRA's reward-difference MSE falls as N_p^-1 (Thm B.3)", f"P-ShareLoRA (SI), eta = 0: "
                      f"{PER_SEED} against N_p in [-1.5, -0.5] (-1 ± half)", -1.5, -0.5)
NEED_ORDER = superiority(
    "Pairs needed for a target accuracy order as the parameter counts (shared B < local < full)", "per seed, pairs "
    "per user where accuracy first reaches target_fraction x the oracle's (log-linear interpolation): P-ShareLoRA "
    "(SI) below LoRA-local and LoRA-local below full, as ratios, Holm over the two cells (spec §7 check 3)",
    scale="ratio", lower_is_better=True)
LOCAL_NEED_RATIO = in_band(
    "LoRA-local needs about the parameter-count ratio more pairs than shared B", "per seed, (pairs needed by "
    "LoRA-local / by P-ShareLoRA (SI)) over the parameter ratio k(d1 + d2) : k(d1 + N d2)/N, within a factor 3",
    1 / 3, 3.0, scale="ratio")
FULL_NEED_RATIO = in_band(
    "Full per-user matrices need about the parameter-count ratio more pairs than shared B", "per seed, (pairs needed "
    "by full / by P-ShareLoRA (SI)) over the parameter ratio d1 d2 : k(d1 + N d2)/N, within a factor 3",
    1 / 3, 3.0, scale="ratio")
DIST_RATE_N = in_band("dist(B^, B°) falls as N^-1/2 with more users (Thm 4.1)", f"P-ShareLoRA (SI): {PER_SEED} "
                      "against N in [-0.75, -0.25]", -0.75, -0.25)
ERROR_FALLS_N = superiority(
    "P-ShareLoRA's per-user parameter error falls with more users", "per seed, error at the largest N over the error "
    "at the smallest below 1; not reproduced when it stays above 0.8 (the old claim's threshold, as the smallest "
    "effect: a factor 1.25)", smallest_effect=0.25, scale="ratio", lower_is_better=True)
LOCAL_FLAT_N = equivalence(
    "LoRA-local's per-user parameter error stays flat in N", "per seed, error at the largest N over the error at the "
    "smallest within [0.8, 1.25] (the old claim's band)", margin=0.25, scale="ratio")
DIST_RATE_NU = in_band("dist(B^, B°) grows as nu falls, about as nu^-1/2 (Thm 4.1)", f"P-ShareLoRA (SI): {PER_SEED} "
                       "against nu (each seed's own nu) in [-1, -0.25]", -1.0, -0.25)
TAIL_FLATTENS = "per seed, the slope in N_p at the largest eta above half the slope at the smallest (at most half as " \
    "steep; spec §8.2: a plateau in dist and in MSE)"
TAIL_FLATTENS_DIST = superiority("A tail flattens P-ShareLoRA's dist(B^, B°) in N_p", TAIL_FLATTENS)
TAIL_FLATTENS_MSE = superiority("A tail flattens P-ShareLoRA's reward-difference MSE in N_p", TAIL_FLATTENS,
                                post_hoc=True)
FULL_BEATS_SI_TAIL = superiority(
    "With a large tail full per-user matrices beat P-ShareLoRA at the largest N_p", "held-out accuracy paired over "
    "seeds at the largest eta and N_p (spec §8.1 prototype: eta 1.5, N_p 800)")

Curve = dict[float, dict[str, list[float]]]  # knob value -> metric -> per-seed values
Curves = dict[str, Curve]  # method -> curve


def problems(cfg: SweepConfig, base: ProblemConfig) -> dict[str, list[tuple[float, ProblemConfig]]]:
    """Every sweep's (knob value, problem) points; the tail sweep is keyed by 'tail=η' per η."""
    out = {"n_train": [(n, base.model_copy(update={"n_train": n})) for n in cfg.n_train],
           "users": [(n, base.model_copy(update={"users": n})) for n in cfg.users],
           "spectrum_decay": [(c, base.model_copy(update={"spectrum_decay": c})) for c in cfg.spectrum_decay]}
    for eta in cfg.tail:
        out[f"tail={eta:g}"] = [(n, base.model_copy(update={"n_train": n, "tail": eta})) for n in cfg.tail_n_train]
    return {name: points for name, points in out.items() if points}


def curves(points: list[tuple[float, ProblemConfig]], methods: list[str], seeds: list[int], fits: dict) -> Curves:
    """Per-seed metrics of every method at every point of one sweep, from the finished fits."""
    out: Curves = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for value, problem in points:
        for m in methods:
            for s in seeds:
                for key, v in fits[problem.model_dump_json(), m, s].items():
                    out[m][value][key].append(v)
    return out


def per_seed(c: Curve, metric: str) -> np.ndarray:
    """(seeds, knob values) array of `metric`, knob values in increasing order."""
    return np.array([c[x][metric] for x in sorted(c)]).T


def seed_slopes(c: Curve, metric: str, x_metric: str | None = None) -> np.ndarray:
    """Per seed, the log-log slope of `metric` against the knob (or against that seed's own `x_metric`)."""
    return slopes(sorted(c) if x_metric is None else per_seed(c, x_metric), per_seed(c, metric))


def rate_claims(c: Curves, tail: float) -> list[dict]:
    """P-ShareLoRA's dist and MSE rates in N_p (Thm 4.1, B.3), rates only when the truth has no tail."""
    claims = (DIST_RATE_NP, "subspace_dist"), (MSE_RATE_NP, "reward_diff_mse")
    if len(c.get("pshare_si", {})) < 2:
        return [not_run(claim, "no N_p sweep of P-ShareLoRA (SI) with 2 points or more") for claim, _ in claims]
    if tail > 0:
        return [not_run(claim, f"eta = {tail:g}: the theory predicts a plateau, not a rate") for claim, _ in claims]
    n_train = sorted(c["pshare_si"])
    return [claim.decide(seed_slopes(c["pshare_si"], metric), n_train=n_train) for claim, metric in claims]


def pairs_to_reach(xs: list[float], ys: np.ndarray, target: float) -> float:
    """Pairs per user where one seed's accuracy first reaches `target` (log-linear interpolation); nan if never."""
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y >= target:
            if i == 0:
                return float(x)
            x0, y0 = xs[i - 1], ys[i - 1]
            return float(np.exp(np.log(x0) + (target - y0) / (y - y0) * (np.log(x) - np.log(x0))))
    return float("nan")


def crossover_claims(c: Curves, problem: ProblemConfig, target_fraction: float, oracle: float) -> list[dict]:
    """§7 check 3: pairs per user needed for a target accuracy scale with the free parameters per user,
    k(d1 + N d2)/N (shared B) : k(d1 + d2) (LoRA-local) : d1 d2 (full)."""
    claims = NEED_ORDER, LOCAL_NEED_RATIO, FULL_NEED_RATIO
    if not {"pshare_si", "local", "full"} <= set(c) or len(c["pshare_si"]) < 2:
        return [not_run(claim, "needs an N_p sweep of P-ShareLoRA (SI), LoRA-local and full") for claim in claims]
    k, d1, d2, n = problem.k, problem.d1, problem.d2, problem.users
    params = {"pshare_si": k * (d1 + n * d2) / n, "local": k * (d1 + d2), "full": d1 * d2}
    target = target_fraction * oracle
    need = {m: np.array([pairs_to_reach(sorted(c[m]), acc, target) for acc in per_seed(c[m], "accuracy")])
            for m in params}
    context = {"target_accuracy": target, "pairs_needed": {m: v.tolist() for m, v in need.items()},
               "params_per_user": params}
    short = [m for m, v in need.items() if np.isnan(v).any()]
    if short:
        reason = f"not at the target accuracy inside the sweep in every seed: {', '.join(LABELS[m] for m in short)}"
        return [not_run(claim, reason) for claim in claims]
    si, local, full = need["pshare_si"], need["local"], need["full"]
    return [NEED_ORDER.decide_cells({"shared B < local": (si, local), "local < full": (local, full)}, **context),
            LOCAL_NEED_RATIO.decide(local / si, params["local"] / params["pshare_si"], **context),
            FULL_NEED_RATIO.decide(full / si, params["full"] / params["pshare_si"], **context)]


def users_claims(c: Curves) -> list[dict]:
    """More users sharpen the shared subspace (dist ~ N^-1/2 at fixed N_p) and lower P-ShareLoRA's per-user error;
    LoRA-local's error does not depend on N."""
    def ends(m: str) -> tuple[np.ndarray, np.ndarray]:
        err = per_seed(c[m], "param_error")
        return err[:, -1], err[:, 0]

    si = len(c.get("pshare_si", {})) > 1
    local = len(c.get("local", {})) > 1
    reason = "no users sweep of {} with 2 points or more"
    users = sorted(next(iter(c.values()))) if c else []
    return [DIST_RATE_N.decide(seed_slopes(c["pshare_si"], "subspace_dist"), users=users) if si else
            not_run(DIST_RATE_N, reason.format("P-ShareLoRA (SI)")),
            ERROR_FALLS_N.decide(*ends("pshare_si"), users=users) if si else
            not_run(ERROR_FALLS_N, reason.format("P-ShareLoRA (SI)")),
            LOCAL_FLAT_N.decide(*ends("local"), users=users) if local else
            not_run(LOCAL_FLAT_N, reason.format("LoRA-local"))]


def nu_claims(c: Curves) -> list[dict]:
    """dist(B^, B°) grows as ν falls, about as ν^-1/2 (Thm 4.1)."""
    if len(c.get("pshare_si", {})) < 2:
        return [not_run(DIST_RATE_NU, "no nu sweep of P-ShareLoRA (SI) with 2 points or more")]
    nus = per_seed(c["pshare_si"], "nu").mean(0).tolist()
    return [DIST_RATE_NU.decide(seed_slopes(c["pshare_si"], "subspace_dist", x_metric="nu"), mean_nu=nus)]


def tail_claims(by_tail: dict[float, Curves]) -> list[dict]:
    """A tail puts a floor under P-ShareLoRA's subspace error (Thm 4.1's bias term), and with a large tail full
    per-user matrices overtake it once data are plentiful (spec §8.1's η = 1.5 regime)."""
    etas = sorted(by_tail)
    claims = TAIL_FLATTENS_DIST, TAIL_FLATTENS_MSE, FULL_BEATS_SI_TAIL
    if len(etas) < 2 or len(by_tail[etas[0]].get("pshare_si", {})) < 2:
        return [not_run(claim, "needs a tail sweep of P-ShareLoRA (SI) at 2 etas and 2 N_p or more")
                for claim in claims]
    low, high = by_tail[etas[0]]["pshare_si"], by_tail[etas[-1]]["pshare_si"]
    out = []
    for claim, metric in ((TAIL_FLATTENS_DIST, "subspace_dist"), (TAIL_FLATTENS_MSE, "reward_diff_mse")):
        s_low, s_high = seed_slopes(low, metric), seed_slopes(high, metric)
        out.append(claim.decide(s_high, 0.5 * s_low, eta=[etas[0], etas[-1]], slope_low_tail=s_low.mean(),
                                slope_high_tail=s_high.mean()))
    if "full" not in by_tail[etas[-1]]:
        return [*out, not_run(FULL_BEATS_SI_TAIL, "full per-user matrices not in the sweep's methods")]
    n_max = max(high)
    full = by_tail[etas[-1]]["full"][n_max]["accuracy"]
    return [*out, FULL_BEATS_SI_TAIL.decide(full, high[n_max]["accuracy"], eta=etas[-1], n_train=n_max,
                                            mean_accuracy={"full": np.mean(full),
                                                           "pshare_si": np.mean(high[n_max]["accuracy"])})]


def sweeps_part(config: Config, fits: dict, oracle: float, run_dir: RunDir) -> Part:
    """Claims, records, slopes and plots of every configured sweep from the finished fits (`oracle`: the main
    problem's oracle accuracy, the crossover's reference); a sweep that is not configured leaves its claims recorded
    as not run."""
    cfg, base, seeds = config.sweep, config.problem, config.sweep_seeds()
    part = Part()
    sweeps = {name: curves(points, cfg.methods, seeds, fits) for name, points in problems(cfg, base).items()}
    for name, points in problems(cfg, base).items():
        c = sweeps[name]
        for value, _ in points:
            for m in cfg.methods:
                for i, s in enumerate(seeds):
                    part.records.append({"experiment": f"sweep_{name}", "method": m, "seed": s, "value": value,
                                         **{k: v[i] for k, v in c[m][value].items()}})
        sweep_plot(run_dir, name, c, "pairs per user N_p" if name == "n_train" or name.startswith("tail") else name)
    empty: Curves = {}
    n_train = sweeps.get("n_train", empty)
    part.claims += rate_claims(n_train, base.tail) + crossover_claims(n_train, base, cfg.target_fraction, oracle)
    part.claims += users_claims(sweeps.get("users", empty)) + nu_claims(sweeps.get("spectrum_decay", empty))
    part.claims += tail_claims({float(name.split("=")[1]): c for name, c in sweeps.items() if name.startswith("tail")})
    part.metrics["sweep_slopes"] = {name: {m: mean_slopes(cm) for m, cm in c.items()} for name, c in sweeps.items()}
    return part


def mean_slopes(c: Curve) -> dict[str, float | None]:
    """The mean over seeds of the per-seed log-log slopes of the error metrics (None with a single knob value)."""
    return {metric: round(float(seed_slopes(c, metric).mean()), 3) if len(c) > 1 else None
            for metric in ("subspace_dist", "reward_diff_mse", "param_error")}
