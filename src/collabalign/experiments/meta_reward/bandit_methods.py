"""The bandit part's runs: its config, every method on every (seed, fold, s_h, β) in batched stages, and the table
that reads a method's values under a β protocol."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, model_validator

from collabalign.config import Grid
from collabalign.experiments.meta_reward.problems.bandit import (
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
from collabalign.experiments.meta_reward.problems.bandit.baselines import dpo, fit_bt, hpl, ppo
from collabalign.seeding import Seeds

NO_BETA = ("SFT", "HPL")


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

    @property
    def betas(self) -> list[float]:
        """Every β the runs use: the tuned protocol's grid and the shared values, ascending."""
        return sorted(set(self.beta_grid) | set(self.shared_betas))


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
    """The held-out metrics and the training-domain validation of the policies `eff` of `rows`."""
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
    rows = Rows.grid(cfg.folds, cfg.sh_values, cfg.betas, cfg.n_dom)
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

