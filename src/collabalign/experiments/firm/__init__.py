"""FIRM reproduction (spec docs/methods/firm.md §8): R0 the regularised MGDA solvers, R1 the synthetic federated
quadratic (FIRM's β sweep against FedCMOO-A, FedAvg-LS and FMOL, the preference sweep, exact upload bytes), R2 T-FIRM
with its TD(0) critic on a tabular MOMDP (the theory's structure), R3 toy federated alignment with PPO (RQ1-RQ3 and
the ablations), then the language-model path: reward models trained on PKU-SafeRLHF (or loaded by name), and FIRM
with its baselines on a LoRA policy (Figs. 1-6, Table 1). One module per part; each declares its claims before
running them, seeds are the replicates."""

from __future__ import annotations

from pathlib import Path

from collabalign.data.paths import shared_data_dir
from collabalign.experiments.firm import lm, momdp, quadratic, reward_models, solver_checks, toy
from collabalign.experiments.firm.config import Config
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

TITLE = ("FIRM: federated in-client regularised multi-objective alignment (solver, quadratic, T-FIRM MOMDP, toy PPO, "
         "language-model policy)")

__all__ = ["TITLE", "Config", "run"]


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    """Every part the config switches on, in the spec's order."""
    seeds = Seeds(cfg.seed)
    parts: list[Part] = []
    if cfg.solver.run:
        parts.append(solver_checks.part(cfg.solver, seeds, run_dir))
    if cfg.quadratic.run:
        parts.append(quadratic.part(cfg.quadratic, seeds, run_dir, progress))
    if cfg.momdp.run:
        parts.append(momdp.part(cfg.momdp, seeds, run_dir, progress))
    if cfg.toy.run:
        parts.append(toy.part(cfg.toy, seeds, run_dir, progress))
    parts += language_model_parts(cfg, seeds, run_dir, progress)
    run_dir.write_parts(parts, plot_metrics=[])


def language_model_parts(cfg: Config, seeds: Seeds, run_dir: RunDir, progress: bool) -> list[Part]:
    """The reward models (fitted, or loaded by name), then the LM path on them when it is switched on."""
    if cfg.hf_rewards is not None:
        parts, rewards = [], reward_models.hf_rewards(cfg.hf_rewards)
    else:
        fitted, rewards = reward_models.part(cfg.rewards, seeds, progress)
        parts = [fitted]
    if not cfg.lm.run:
        return parts
    if rewards is not None and cfg.lm.helpful == "relevance":
        rewards = reward_models.with_relevance(rewards)
    root = Path(cfg.rewards.data_dir) if cfg.rewards.data_dir else shared_data_dir()
    if rewards is None or (root is None and cfg.lm.data is None):
        return [*parts, lm.not_run_part("no reward models, or neither lm.data nor a data folder (../shared/data, "
                                        "$COLLABALIGN_DATA)")]
    return [*parts, lm.part(cfg, rewards, seeds, run_dir, root, progress)]
