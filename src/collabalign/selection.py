"""Choosing hyperparameters from a grid by a score measured on held-out training data (never on the data the
result is scored on): one rule for every reproduction."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

import numpy as np
import torch

K = TypeVar("K", bound=Hashable)


def best(scores: Mapping[K, float]) -> K:
    """The grid point with the highest score; on a tie the smallest point; NaN (a run that diverged) never wins
    over a number."""
    return min(scores, key=lambda k: (math.isnan(scores[k]), -(0.0 if math.isnan(scores[k]) else scores[k]), k))


def held_out_slice(groups: np.ndarray, fraction: float, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices (fit, select): `fraction` of each group's rows (seeded; one group: of all rows) held out to
    choose on, both sorted by group, then by row."""
    fit_rows, select_rows = [], []
    for g in np.unique(groups):
        rows = rng.permutation(np.flatnonzero(groups == g))
        n = round(fraction * len(rows))
        select_rows.append(np.sort(rows[:n]))
        fit_rows.append(np.sort(rows[n:]))
    return torch.from_numpy(np.concatenate(fit_rows)), torch.from_numpy(np.concatenate(select_rows))
