"""Small curve fits shared by the reproductions' rate and scaling claims."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def loglog_slope(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept of log y against log x."""
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)
