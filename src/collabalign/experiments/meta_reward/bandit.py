"""Variant A of the meta-learned reward model's reproduction (spec ../shared/specs/meta-reward.md §8.1, §8.3): the
log-linear multi-domain contextual bandit, leave-one-domain-out, with ours (Algorithms 1 + 2), SFT, BT+RWR, PPO(TR),
PPO(TR+TE), DPO, HPL and Oracle RWR. Two β protocols: one shared β for every method that has one, and β tuned per
method on the training domains' validation pairs. Seeds are the replicates; each cell of an "in every cell" claim is
a held-out domain (× baseline); otherwise values are means over the folds. All runs of a stage are one batched
computation over (seed, fold, s_h, β)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, model_validator

from collabalign import claims
from collabalign.claims import tagged
from collabalign.config import Grid
from collabalign.methods.meta_reward.bandit import (
    BanditSettings,
    BanditWorld,
    Rows,
    check_hypergradient,
    heldout_metrics,
    joint_eff,
    meta_train,
    minibatch_counts,
    rwr,
    sft,
    split_eff,
    validation,
)
from collabalign.methods.meta_reward.bandit_baselines import dpo, fit_bt, hpl, ppo
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

CHANCE = 0.5
BASELINES = ("SFT", "BT+RWR", "PPO(TR)", "PPO(TR+TE)", "DPO", "HPL")
PREFERENCE_METHODS = ("BT+RWR", "PPO(TR+TE)", "PPO(TR)", "DPO", "HPL")
NO_BETA = ("SFT", "HPL")

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


class BanditConfig(BanditSettings):
    """The bandit part: the method settings (BanditSettings) plus seeds, folds and the β protocols."""

    run: bool = True
    seeds: int = Field(5, ge=1)
    folds: Grid[NonNegativeInt] = [0, 1, 2, 3]  # held-out domains (leave-one-domain-out)
    shared_betas: Grid[PositiveFloat] = [1.0, 4.0]
    beta_grid: Grid[PositiveFloat] = [0.1, 1.0, 2.0, 4.0, 8.0]  # tuned protocol and the β sweep
    sh_values: Grid[Literal[0, 1]] = [0, 1]
    temperatures: Grid[PositiveFloat] = [0.25, 0.5, 0.75, 1.0]
    check_steps: int = Field(5, ge=1)

    @model_validator(mode="after")
    def _valid(self) -> BanditConfig:
        bad = [h for h in self.folds if h >= self.n_dom]
        if bad:
            raise ValueError(f"held-out domain(s) {bad} outside 0..{self.n_dom - 1}")
        if self.test_steps < self.inner_steps:
            raise ValueError(f"test_steps {self.test_steps} < inner_steps {self.inner_steps}: the matched meta-test "
                             "is read off the converged run")
        return self


@dataclasses.dataclass
class Method:
    """One method's rows and its measurements per (seed, row): held-out metrics plus validation A_PL / ℓ_PL."""

    rows: Rows
    values: dict[str, torch.Tensor]

    def __post_init__(self) -> None:
        self._index: dict[tuple[int, int, float | None], int] = {}
        for m, (h, sh, b) in enumerate(zip(self.rows.fold.tolist(), self.rows.sh.tolist(), self.rows.beta.tolist(),
                                           strict=True)):
            self._index.setdefault((h, int(sh), b), m)
            self._index.setdefault((h, int(sh), None), m)

    def index(self, fold: int, sh: int, beta: float | None) -> int:
        """The row of (fold, s_h, β); β None: the first row of (fold, s_h) (methods without β)."""
        return self._index[fold, sh, beta]


def measure(world: BanditWorld, eff: torch.Tensor, rows: Rows, cfg: BanditConfig) -> Method:
    values = heldout_metrics(world, eff, rows, cfg.temperatures)
    values["val_apl"], values["val_loss"] = validation(world, eff, rows)
    return Method(rows, values)


def run_methods(cfg: BanditConfig, seeds: Seeds, progress: bool) -> dict[str, Any]:
    """Every method on every (seed, fold, s_h, β): measurements, the reward models and the timings."""
    t0, seconds = time.perf_counter(), {}

    def lap(name: str) -> None:
        seconds[name] = round(time.perf_counter() - t0 - sum(seconds.values()), 2)
        if progress:
            print(f"meta-reward bandit: {name} done ({seconds[name]:.1f} s)", flush=True)

    world = BanditWorld.generate([seeds.numpy("meta-reward/bandit/world", s) for s in range(cfg.seeds)], cfg)
    S, N, E = world.seeds, world.n_dom, world.fine.fex.shape[2]
    theta_sft = sft(world, cfg)
    betas = sorted(set(cfg.beta_grid) | set(cfg.shared_betas))
    rows = Rows.grid(cfg.folds, cfg.sh_values, betas, cfg.n_dom)
    position = torch.tensor([cfg.folds.index(int(h)) for h in rows.fold])
    lap("world and SFT")
    meta = meta_train(world, theta_sft, rows, cfg, seeds.torch("meta-reward/bandit/meta-train"), progress)
    lap("meta-training")
    phi_bt = fit_bt(world, torch.tensor(cfg.folds), cfg)
    rwr_rows = rows.repeat(3)
    phis = torch.cat([meta.phi, phi_bt[:, position], world.u_star[:, None].expand(-1, len(rows), -1)], 1)
    counts = minibatch_counts(seeds.torch("meta-reward/bandit/meta-test"), (S, N, cfg.test_steps), E,
                              cfg.inner_batch)
    best, kept = rwr(world, theta_sft[:, rwr_rows.sh.long()], phis, rwr_rows, cfg, counts, keep=(cfg.inner_steps,))
    converged = measure(world, split_eff(best, rwr_rows.sh), rwr_rows, cfg)
    matched = measure(world, split_eff(kept[cfg.inner_steps], rwr_rows.sh), rwr_rows, cfg)
    M = len(rows)
    methods = {}
    for i, name in enumerate(("ours", "BT+RWR", "oracle RWR")):
        methods[name] = Method(rows, {k: v[:, i * M:(i + 1) * M] for k, v in converged.values.items()})
        methods[f"{name} (matched)"] = Method(rows, {k: v[:, i * M:(i + 1) * M] for k, v in matched.values.items()})
    lap("meta-test and RWR baselines")
    ppo_rows = rows.repeat(2)
    prompts = torch.cat([rows.train_mask(N), torch.ones(M, N, dtype=rows.sh.dtype)])
    theta = ppo(world, theta_sft, phi_bt[:, position].repeat(1, 2, 1), ppo_rows, prompts, cfg)
    both = measure(world, joint_eff(theta, ppo_rows.sh), ppo_rows, cfg)
    methods["PPO(TR)"] = Method(rows, {k: v[:, :M] for k, v in both.values.items()})
    methods["PPO(TR+TE)"] = Method(rows, {k: v[:, M:] for k, v in both.values.items()})
    lap("PPO")
    methods["DPO"] = measure(world, joint_eff(dpo(world, theta_sft, rows, cfg), rows.sh), rows, cfg)
    plain = Rows.grid(cfg.folds, cfg.sh_values, [1.0], cfg.n_dom)
    methods["HPL"] = measure(world, joint_eff(hpl(world, theta_sft, plain, cfg), plain.sh), plain, cfg)
    methods["SFT"] = measure(world, joint_eff(theta_sft[:, plain.sh.long()], plain.sh), plain, cfg)
    lap("DPO, HPL and SFT")
    check = check_hypergradient(world, theta_sft, cfg.folds[0], cfg, seeds.torch("meta-reward/bandit/fd-check"),
                                cfg.check_steps)
    lap("finite-difference check")
    return {"world": world, "rows": rows, "methods": methods, "meta": meta, "phi_bt": phi_bt, "check": check,
            "seconds": seconds}


class Table:
    """Per-seed, per-fold values (S, H) of a method's metric under an s_h and a β protocol."""

    def __init__(self, cfg: BanditConfig, methods: dict[str, Method]):
        self.cfg, self.methods = cfg, methods
        self.protocols = [f"β={b:g}" for b in cfg.shared_betas] + ["tuned β"]
        self.chosen: dict[tuple[str, int], np.ndarray] = {}  # (method, s_h) -> (S, H) chosen β

    def beta_of(self, method: str, sh: int, protocol: str) -> np.ndarray | None:
        """(S, H) β used by the method under the protocol (None for methods without β)."""
        if method.split(" (")[0] in NO_BETA:
            return None
        if protocol != "tuned β":
            return np.full((self.cfg.seeds, len(self.cfg.folds)), float(protocol[2:]))
        if (method, sh) not in self.chosen:
            m = self.methods[method]
            out = np.zeros((self.cfg.seeds, len(self.cfg.folds)))
            for j, h in enumerate(self.cfg.folds):
                idx = [m.index(h, sh, b) for b in self.cfg.beta_grid]
                acc = m.values["val_apl"][:, idx].numpy()
                loss = m.values["val_loss"][:, idx].numpy()
                best = np.lexsort((loss, -acc), axis=-1)[:, 0]  # highest A_PL, then lowest ℓ_PL, then first β
                out[:, j] = np.asarray(self.cfg.beta_grid)[best]
            self.chosen[method, sh] = out
        return self.chosen[method, sh]

    def get(self, method: str, sh: int, protocol: str, metric: str = "apl") -> np.ndarray:
        m, beta = self.methods[method], self.beta_of(method, sh, protocol)
        out = np.zeros((self.cfg.seeds, len(self.cfg.folds)))
        for j, h in enumerate(self.cfg.folds):
            for s in range(self.cfg.seeds):
                out[s, j] = m.values[metric][s, m.index(h, sh, None if beta is None else float(beta[s, j]))]
        return out


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


def table_rows_index(rows: Rows, folds: list[int], sh: int, beta: float) -> list[int]:
    return [next(m for m in range(len(rows)) if int(rows.fold[m]) == h and int(rows.sh[m]) == sh
                 and float(rows.beta[m]) == beta) for h in folds]


def reward_models(cfg: BanditConfig, result: dict[str, Any]) -> dict[str, Any]:
    """‖φ‖ and cos(φ, u*) of the meta-RMs (per s_h and β) and of the BT RM (means over seeds and folds)."""
    u = result["world"].u_star

    def stats(phi: torch.Tensor) -> dict[str, float]:  # phi (S, H, K)
        cos = torch.nn.functional.cosine_similarity(phi, u[:, None].expand_as(phi), dim=-1)
        return {"norm": round(float(phi.norm(dim=-1).mean()), 4), "cos_u_star": round(float(cos.mean()), 4)}

    rows, meta = result["rows"], result["meta"]
    betas = sorted(set(cfg.beta_grid) | set(cfg.shared_betas))
    ours = {f"s_h={sh}": {f"β={b:g}": stats(meta.phi[:, table_rows_index(rows, cfg.folds, sh, b)]) for b in betas}
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
        for b in sorted(set(cfg.beta_grid) | set(cfg.shared_betas)):
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
            for b in sorted(set(cfg.beta_grid) | set(cfg.shared_betas)):
                sel = (rows.sh == sh) & (rows.beta == b)
                rows_out.append({"part": "bandit", "kind": "meta_training", "step": k, "s_h": sh, "beta": b,
                                 "val_apl": round(float(meta.val_apl[e][:, sel].mean()), 6),
                                 "outer_loss": None if window is None else round(float(window[:, :, sel].mean()), 6)})
        previous = k
    return rows_out


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
