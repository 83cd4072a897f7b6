"""Choosing hyperparameters from a grid by a score measured on held-out training data (never on the data the
result is scored on): one rule for every reproduction."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def best(scores: Mapping[K, float]) -> K:
    """The grid point with the highest score; on a tie the smallest point; NaN (a run that diverged) never wins
    over a number."""
    return min(scores, key=lambda k: (math.isnan(scores[k]), -(0.0 if math.isnan(scores[k]) else scores[k]), k))
