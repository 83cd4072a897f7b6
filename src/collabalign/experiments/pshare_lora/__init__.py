"""P-ShareLoRA reproduction (spec docs/methods/pshare-lora.md §8): every method on the §8.1 bilinear preference
problem over seeds with the paper's ordering as claims, the §8.2 theory sweeps, and, when enabled, the §8.3
pessimistic bandit, the federated variant and the §8.4 text reward models."""

from __future__ import annotations

from collabalign.experiments.pshare_lora.bandit import bandit_part
from collabalign.experiments.pshare_lora.comparison import comparison_part
from collabalign.experiments.pshare_lora.config import Config
from collabalign.experiments.pshare_lora.federated import federated_part
from collabalign.experiments.pshare_lora.fits import run_fits
from collabalign.experiments.pshare_lora.sweeps import sweeps_part
from collabalign.experiments.pshare_lora.text import text_part
from collabalign.runs import Part, RunDir

TITLE = "P-ShareLoRA: personalised reward models sharing a low-rank factor (synthetic)"

__all__ = ["TITLE", "Config", "run"]


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    """The synthetic comparison and sweeps (one pool of fits; skipped when `methods` is empty), then every enabled
    part: the §8.3 bandit, the federated variant and the text reward models."""
    parts: list[Part] = []
    if cfg.methods:
        fits = run_fits(cfg, run_dir, progress)
        comparison = comparison_part(cfg, fits)
        parts += [comparison, sweeps_part(cfg, fits, comparison.metrics["diversity"]["oracle_accuracy"], run_dir)]
    if cfg.bandit.run:
        parts.append(bandit_part(cfg, run_dir, progress))
    if cfg.federated.run:
        parts.append(federated_part(cfg, run_dir, progress))
    if cfg.text.run:
        parts.append(text_part(cfg, run_dir, progress))
    run_dir.write_parts(parts, plot_metrics=[])
