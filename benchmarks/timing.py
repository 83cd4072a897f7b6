"""Side-by-side timing: candidates are run interleaved, round after round, and compared by median."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def compare(candidates: dict[str, Callable[[], object]], rounds: int = 15, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call for each candidate, measured interleaved so machine noise hits all alike."""
    for fn in candidates.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}
