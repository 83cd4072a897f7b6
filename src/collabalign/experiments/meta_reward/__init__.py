"""Reproduction of the meta-learned reward model for out-of-distribution preference learning (spec
docs/methods/meta-reward.md §8): Variant A, the log-linear multi-domain contextual bandit (exact gradients and
Hessian-vector products, every method and baseline, both β protocols, the β sweep and the hypergradient check), then
the sentiment task on real Amazon reviews (or the user's preference pairs with a `domain`: `sentiment.data`) with a
SmolLM2 policy (paper §5.1 at CPU scale). One module per part; each declares its claims before running; seeds are
the replicates."""

from __future__ import annotations

from pathlib import Path

from pydantic import NonNegativeInt

from collabalign.config import Strict
from collabalign.data.paths import shared_data_dir
from collabalign.experiments.meta_reward import bandit, sentiment
from collabalign.experiments.meta_reward.bandit_methods import BanditConfig
from collabalign.experiments.meta_reward.sentiment_config import SentimentConfig
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

TITLE = "Meta-learned reward model for out-of-distribution preference learning (bandit, Amazon sentiment)"


class Config(Strict):
    """The two parts. No `engine:` section: neither part runs the federated round engine (Algorithm 1 samples
    domains inside one process; there are no clients, messages or rounds for an engine option to act on)."""

    seed: NonNegativeInt = 0
    bandit: BanditConfig = BanditConfig()
    sentiment: SentimentConfig = SentimentConfig()


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    """The bandit, then the sentiment task on the user's JSONL pairs, or on the Amazon reviews when the shared data
    folder is there."""
    seeds = Seeds(cfg.seed)
    parts: list[Part] = []
    if cfg.bandit.run:
        parts.append(bandit.part(cfg.bandit, seeds, run_dir, progress))
    if cfg.sentiment.run:
        root = Path(cfg.sentiment.data_dir) if cfg.sentiment.data_dir else shared_data_dir()
        if root is None and cfg.sentiment.data.source == "amazon":
            parts.append(sentiment.not_run_part("no data folder (../shared/data, $COLLABALIGN_DATA)"))
        else:
            parts.append(sentiment.part(cfg.sentiment, root, seeds, run_dir, progress))
    run_dir.write_parts(parts, plot_metrics=[])
