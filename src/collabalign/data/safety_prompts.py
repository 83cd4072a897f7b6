"""Prompts for safety alignment runs: the last Human turn of HH-RLHF harmless dialogues and PKU-SafeRLHF prompts,
deduplicated, length-filtered, with a keyword topic each (the label of Dirichlet splits), split into train and a
fixed held-out evaluation set."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collabalign.data.hh_rlhf import HH_FILE, topic_of
from collabalign.data.pku_saferlhf import hh_prompts, load_pku_saferlhf, pku_prompts

PKU_FILE = "pku-saferlhf/alpaca7b-test-head.jsonl.gz"


@dataclass(frozen=True)
class SafetyPrompts:
    train: list[str]
    train_topics: list[str]
    eval: list[str]
    dropped_long: int  # prompts over the token limit, left out (never truncated)


def safety_prompts(root: str | Path, per_source: int, n_eval: int, count_tokens: Callable[[str], int],
                   max_tokens: int, rng: np.random.Generator) -> SafetyPrompts:
    """Up to `per_source` prompts from each file that fit in `max_tokens`; `n_eval` of them held out for evaluation."""
    root = Path(root)
    chosen, dropped = [], 0
    for source in (hh_prompts(root / HH_FILE), pku_prompts(load_pku_saferlhf(root / PKU_FILE))):
        unique = [p for p in source if p.strip()]
        fits = [p for p in unique if count_tokens(p) <= max_tokens]
        dropped += len(unique) - len(fits)
        chosen += [fits[i] for i in np.sort(rng.permutation(len(fits))[:per_source])]
    order = rng.permutation(len(chosen))
    held, train = order[:n_eval], order[n_eval:]
    train_prompts = [chosen[i] for i in train]
    return SafetyPrompts(train_prompts, [topic_of(p) for p in train_prompts], [chosen[i] for i in held], dropped)
