"""R2 of the FIRM reproduction (spec §8 R2, §7): T-FIRM with the projected Markovian TD(0) critic on the tabular
MOMDP, checking the theory's structure: the stationarity measure decreases, η_t = 1/t smoothing and β cut the λ
dispersion, the floor falls with B and C, the critic converges (Lemma 3), and Lemmas 7 and 10 hold at every step.
Each seed is a fresh MOMDP (replicate); variants (β × η) run side by side on the same MOMDPs."""

from __future__ import annotations

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Fraction, Grid, Strict
from collabalign.experiments.firm import plots
from collabalign.experiments.firm.common import summary
from collabalign.experiments.firm.problems.tfirm import MOMDP, Critic, Setting, Variant, critic_errors, simulate
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

STATIONARITY = claims.superiority(
    "R2: T-FIRM's stationarity measure decreases",
    "per-seed ratio late / early of ‖∇J(θ̄_t)λ̄_t‖² (means over the last and the first `window` share of the "
    "rounds) below 1 at every β (η_t = 1/t; Holm over β)", lower_is_better=True, scale="ratio")
SMOOTHING = claims.superiority(
    "R2: η_t = 1/t smoothing cuts the λ dispersion",
    "per-seed ratio D_λ(η_t = 1/t) / D_λ(η = 1) (mean over all local steps) below 1 at every β (Holm over β)",
    lower_is_better=True, scale="ratio")
BETA_DISPERSION = claims.superiority(
    "R2: λ dispersion falls as β grows",
    "per-seed slope of log D_λ (η = 1, mean over all local steps) against log β over the positive β below 0",
    lower_is_better=True)
FLOOR_B = claims.superiority(
    "R2: the stationarity floor falls as the batch B grows",
    "per-seed slope of log floor (‖∇J(θ̄_t)λ̄_t‖² averaged over the last `window` share of the rounds) against "
    "log B below 0", lower_is_better=True)
FLOOR_C = claims.superiority(
    "R2: the stationarity floor falls as the number of clients C grows",
    "per-seed slope of log floor against log C below 0", lower_is_better=True)
LEMMA7 = claims.exact(
    "R2: Lemma 7's gradient bound holds at every step",
    "number of (seed, variant) runs with some ‖g^{j,c}‖ > C_ψ (r_max + (1 + γ) R_w), C_ψ = √2: 0 (worst ratio "
    "reported)")
LEMMA10 = claims.exact(
    "R2: Lemma 10's smoothing bound holds at every step",
    "number of (seed, variant) runs with some ‖λ^c_t − λ^c_{t+1}‖₁ > 2 η_{t+1}: 0 (worst ratio reported)")
CRITIC = claims.superiority(
    "R2: the TD(0) critic converges to V^π on a fixed policy (Lemma 3)",
    "per-seed ‖w_N − V^π‖² after the last critic mini-batch below 1% of its start value ‖V^π‖² (ratio scale), at "
    "the run's critic batch D", lower_is_better=True, scale="ratio")
CRITIC_BATCH = claims.superiority(
    "R2: the critic's error floor falls as its mini-batch D grows (Lemma 3)",
    "per-seed slope of log ‖w − V^π‖² (mean over the last quarter of the mini-batches) against log D below 0",
    lower_is_better=True)


class MOMDPConfig(Strict):
    run: bool = True
    seeds: PositiveInt = 5
    states: PositiveInt = 6
    actions: int = Field(3, ge=2)
    gamma: float = Field(0.9, ge=0, lt=1)
    clients: PositiveInt = 8
    rounds: PositiveInt = 100
    local_steps: PositiveInt = 5
    batch: PositiveInt = 32
    alpha: PositiveFloat = 0.5
    critic_step: PositiveFloat = 0.5
    critic_iterations: PositiveInt = 5
    critic_batch: PositiveInt = 16
    radius: PositiveFloat = 40.0
    betas: Grid[NonNegativeFloat] = [0.0, 0.01, 0.1, 1.0]
    normalize: bool = False  # the theory has no trace normalisation (spec §9 item 4)
    window: Fraction = 0.1
    sweep_beta: NonNegativeFloat = 0.01
    batch_sweep: Grid[PositiveInt] = [8, 32, 128]
    client_sweep: Grid[PositiveInt] = [2, 8, 16]
    lemma3_iterations: PositiveInt = 1000
    lemma3_batches: Grid[PositiveInt] = [4, 16, 64]


def setting(cfg: MOMDPConfig, clients: int | None = None, batch: int | None = None) -> Setting:
    return Setting(clients or cfg.clients, cfg.rounds, cfg.local_steps, batch or cfg.batch, cfg.alpha,
                   Critic(cfg.critic_iterations, cfg.critic_batch, cfg.critic_step, cfg.radius))


def window(cfg: MOMDPConfig) -> int:
    return max(1, int(round(cfg.window * cfg.rounds)))


def part(cfg: MOMDPConfig, seeds: Seeds, run_dir: RunDir, progress: bool = True) -> Part:
    """The β × η run, the B and C sweeps and the fixed-policy critic check: records, claims, plots."""
    env = MOMDP(seeds.numpy("firm/r2/momdp"), cfg.seeds, cfg.states, cfg.actions, cfg.gamma)
    variants = [Variant(b, eta, cfg.normalize) for b in cfg.betas for eta in ("1/t", 1.0)]
    labels = [v.label for v in variants]
    out = simulate(env, variants, setting(cfg), seeds.numpy("firm/r2/main"))
    if progress:
        print("firm r2: beta x eta run done", flush=True)
    w = window(cfg)
    idx = {(v.beta, v.eta): i for i, v in enumerate(variants)}
    decided = [stationarity_claim(cfg, out, idx, w), smoothing_claim(cfg, out, idx)]
    positive = [b for b in cfg.betas if b > 0]
    if len(positive) >= 2:
        disp = np.stack([out["dispersion"][:, :, idx[b, 1.0]].mean(0) for b in positive], 1)
        slopes = claims.slopes(positive, disp)
        decided.append(BETA_DISPERSION.decide(slopes, 0.0, slopes=summary(slopes), betas=positive))
    else:
        decided.append(claims.not_run(BETA_DISPERSION, "fewer than two positive β"))
    floors, floor_context = {}, {}
    for claim, name, values in ((FLOOR_B, "B", cfg.batch_sweep), (FLOOR_C, "C", cfg.client_sweep)):
        if len(values) < 2:
            decided.append(claims.not_run(claim, f"fewer than two values of {name}"))
            continue
        ys = np.stack([floor(cfg, env, seeds, out, idx, name, v, w) for v in values], 1)  # (S, values)
        slopes = claims.slopes(values, ys)
        floors[name] = (values, ys)
        floor_context[name] = {f"{v}": summary(y) for v, y in zip(values, ys.T, strict=True)}
        decided.append(claim.decide(slopes, 0.0, slopes=summary(slopes), floors=floor_context[name],
                                    beta=cfg.sweep_beta))
        if progress:
            print(f"firm r2: {name} sweep done", flush=True)
    decided += [LEMMA7.decide(int((~out["lemma7_holds"]).sum()), 0, worst_ratio=float(out["lemma7_worst"].max())),
                LEMMA10.decide(int((~out["lemma10_holds"]).sum()), 0, worst_ratio=float(out["lemma10_worst"].max()))]
    critic = lemma3(cfg, env, seeds)
    decided += critic_claims(cfg, critic)
    rows = [{"part": "r2", "method": label, "round": t + 1,
             **{k: float(out[k][t, :, i].mean()) for k in ("stationarity", "stationarity_lambda_bar",
                                                           "running_average", "dispersion", "critic_error")},
             "J1": float(out["J"][t, :, i, 0].mean()), "J2": float(out["J"][t, :, i, 1].mean())}
            for i, label in enumerate(labels) for t in range(cfg.rounds)]
    plots.r2(run_dir.path / "plots", labels, out, critic, floors)
    metrics = {label: {"final_stationarity": float(out["stationarity"][-w:, :, i].mean()),
                       "final_running_average": float(out["running_average"][-1, :, i].mean()),
                       "dispersion": float(out["dispersion"][:, :, i].mean()),
                       "critic_error": float(out["critic_error"][:, :, i].mean()),
                       "final_J": out["J"][-1, :, i].mean(0).tolist()} for i, label in enumerate(labels)}
    note = (f"R2 (spec §8): n_S = {cfg.states}, n_A = {cfg.actions}, γ = {cfg.gamma}, C = {cfg.clients}, "
            f"T = {cfg.rounds} rounds of K = {cfg.local_steps}, B = {cfg.batch}, critic N = {cfg.critic_iterations} × "
            f"D = {cfg.critic_batch}, α = {cfg.alpha}, α' = {cfg.critic_step}, R_w = {cfg.radius}, "
            f"{'trace-normalised' if cfg.normalize else 'raw'} G, {cfg.seeds} MOMDPs (seeds). Floors and early/late "
            f"means over {w} rounds; the B and C sweeps run β = {cfg.sweep_beta:g}, η = 1/t.")
    return Part(claims=decided, records=rows, metrics={"r2": {"variants": metrics, "floors": floor_context,
                                                              "lemma3_final_error": {
                                                                  str(d): float(e[-1].mean()) for d, e in
                                                                  critic.items()}}}, notes=[note])


def stationarity_claim(cfg: MOMDPConfig, out: dict, idx: dict, w: int) -> dict:
    """Late against early ‖∇J(θ̄)λ̄‖² at every β with η = 1/t."""
    curve = out["stationarity_lambda_bar"]
    cells = {f"beta={b:g}": (curve[-w:, :, idx[b, "1/t"]].mean(0), curve[:w, :, idx[b, "1/t"]].mean(0))
             for b in cfg.betas}
    return STATIONARITY.decide_cells(cells, early={k: float(v[1].mean()) for k, v in cells.items()},
                                     late={k: float(v[0].mean()) for k, v in cells.items()}, rounds=w)


def smoothing_claim(cfg: MOMDPConfig, out: dict, idx: dict) -> dict:
    disp = out["dispersion"].mean(0)  # (S, V)
    cells = {f"beta={b:g}": (np.maximum(disp[:, idx[b, "1/t"]], 1e-300), np.maximum(disp[:, idx[b, 1.0]], 1e-300))
             for b in cfg.betas}
    return SMOOTHING.decide_cells(cells, smoothed={k: float(v[0].mean()) for k, v in cells.items()},
                                  unsmoothed={k: float(v[1].mean()) for k, v in cells.items()})


def floor(cfg: MOMDPConfig, env: MOMDP, seeds: Seeds, out: dict, idx: dict, name: str, value: int,
          w: int) -> np.ndarray:
    """Per-seed floor of ‖∇J(θ̄)λ̄‖² at one B or C (β = sweep_beta, η = 1/t); the main run supplies its own point."""
    clients, batch = (cfg.clients, value) if name == "B" else (value, cfg.batch)
    if (clients, batch) == (cfg.clients, cfg.batch) and (cfg.sweep_beta, "1/t") in idx:
        curve = out["stationarity_lambda_bar"][:, :, idx[cfg.sweep_beta, "1/t"]]
    else:
        run = simulate(env, [Variant(cfg.sweep_beta, "1/t", cfg.normalize)], setting(cfg, clients, batch),
                       seeds.numpy(f"firm/r2/sweep/C={clients}/B={batch}"))
        curve = run["stationarity_lambda_bar"][:, :, 0]
    return curve[-w:].mean(0)


def lemma3(cfg: MOMDPConfig, env: MOMDP, seeds: Seeds) -> dict[int, np.ndarray]:
    """Critic error against mini-batches on a fixed random policy per MOMDP, for each critic batch D."""
    theta = seeds.numpy("firm/r2/lemma3/policy").standard_normal((cfg.seeds, cfg.states, cfg.actions))
    return {d: critic_errors(env, theta, Critic(cfg.lemma3_iterations, d, cfg.critic_step, cfg.radius),
                             seeds.numpy(f"firm/r2/lemma3/D={d}")) for d in cfg.lemma3_batches}


def critic_claims(cfg: MOMDPConfig, critic: dict[int, np.ndarray]) -> list[dict]:
    out = []
    d = cfg.critic_batch if cfg.critic_batch in critic else next(iter(critic), None)
    if d is None:
        return [claims.not_run(CRITIC, "no critic batches"), claims.not_run(CRITIC_BATCH, "no critic batches")]
    errs = critic[d]
    out.append(tagged(CRITIC, f"D={d}, N={cfg.lemma3_iterations}").decide(
        errs[-1], 0.01 * errs[0], start=summary(errs[0]), end=summary(errs[-1])))
    if len(critic) >= 2:
        tail = max(1, cfg.lemma3_iterations // 4)
        ys = np.stack([e[-tail:].mean(0) for e in critic.values()], 1)
        slopes = claims.slopes(list(critic), ys)
        out.append(CRITIC_BATCH.decide(slopes, 0.0, slopes=summary(slopes),
                                       floors={str(k): summary(y) for k, y in zip(critic, ys.T, strict=True)}))
    else:
        out.append(claims.not_run(CRITIC_BATCH, "one critic batch only"))
    return out
