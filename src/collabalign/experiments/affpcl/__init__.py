"""AffPCL reproduction (spec docs/methods/affpcl.md §8): Fig. 1 on the Gaussian linear systems at both
heterogeneity sets the paper states, Remark 1's communication, the theory checks of §7.2 (rate in t, speed-up
max{1/n, delta}; then items 6-9: central modules, server-side correction, noise alignment, Theorem 2), Fig. 6 (the
centre agent's free ride), the Fig. 4 / Fig. 5 sweeps, Fig. 2 on the digits substitute for FEMNIST in the paper's
setting, Fig. 3's RL panels and personalised reward models from preference data (§8.3). One module per part;
each declares its claims before running them, and every claim is decided by claims.py with runs as replicates."""

from __future__ import annotations

from pydantic import NonNegativeInt

from collabalign.config import Strict
from collabalign.experiments.affpcl import checks, communication, digits, fig1, fig6, reward, rl, sweeps, theory
from collabalign.experiments.affpcl.checks import ChecksConfig
from collabalign.experiments.affpcl.digits import DigitsConfig
from collabalign.experiments.affpcl.fig1 import Fig1Config
from collabalign.experiments.affpcl.fig6 import Fig6Config
from collabalign.experiments.affpcl.reward import RewardConfig
from collabalign.experiments.affpcl.rl import RLConfig
from collabalign.experiments.affpcl.sweeps import SweepConfig
from collabalign.experiments.affpcl.theory import TheoryConfig
from collabalign.federation.engine import EngineOptions
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

TITLE = ("AffPCL: personalised collaborative learning with affinity-based variance reduction (synthetic systems, "
         "digits, RL)")


class Config(Strict):
    seed: NonNegativeInt = 0
    engine: EngineOptions = EngineOptions()  # the communication part's federated runs: fault handling and engine
    fig1: Fig1Config = Fig1Config()
    theory: TheoryConfig = TheoryConfig()
    checks: ChecksConfig = ChecksConfig()
    fig6: Fig6Config = Fig6Config()
    sweeps: SweepConfig = SweepConfig()
    digits: DigitsConfig = DigitsConfig()
    rl: RLConfig = RLConfig()
    reward: RewardConfig = RewardConfig()


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    """Fig. 1 and the communication check, then every part the config switches on, in the report's order."""
    seeds = Seeds(cfg.seed)
    parts: list[Part] = [fig1.part(cfg.fig1, seeds, run_dir, progress),
                         communication.part(cfg.fig1, cfg.engine, seeds, run_dir)]
    if cfg.theory.run:
        parts.append(theory.part(cfg.theory, seeds, run_dir))
    if cfg.checks.run:
        parts.append(checks.part(cfg.checks, seeds))
    if cfg.fig6.run:
        parts.append(fig6.part(cfg.fig6, seeds, run_dir))
    if cfg.sweeps.run:
        parts.append(sweeps.part(cfg.sweeps, seeds, run_dir))
    if cfg.digits.run:
        parts.append(digits.part(cfg.digits, seeds, run_dir, progress))
    if cfg.rl.run:
        parts.append(rl.part(cfg.rl, seeds, run_dir, progress))
    if cfg.reward.run:
        parts.append(reward.part(cfg.reward, seeds, run_dir, progress))
    run_dir.write_parts(parts, plot_metrics=[])
