"""The one rule that decides every claim of every reproduction (docs/concepts.md "Claims").

A claim is declared before the run that tests it: what it says, which rule decides it, and its margin. Its
`decide` then takes the measured replicates (one value per seed or run; arms that share seeds are paired) and
returns the record that goes into summary.json. No verdict is decided anywhere else.

- Interval: two-sided 95% t-interval of the mean paired difference (n - 1 degrees of freedom); a percentile
  bootstrap of the mean (10 000 resamples, fixed generator) from n >= 20. Fewer than 3 replicates: inconclusive.
- Superiority "A > B": reproduced when the interval's lower end is above 0; not reproduced when its upper end is
  below the declared smallest effect of interest (default 0); else inconclusive. A tie never confirms.
- Non-inferiority "A >= B - margin": reproduced when the lower end is above -margin; not reproduced when the upper
  end is below -margin. One-sided claims of the papers ("never worse", "matches when ...") are coded this way.
- Equivalence "A ~ B": reproduced when the interval lies inside (-margin, margin); not reproduced when it lies
  wholly outside.
- Band "value in [low, high]" (one sample, e.g. a slope fitted per seed): inside / wholly outside.
- Exact: a deterministic quantity (bytes on the wire) equal to its expected value within a tolerance.
- "In every cell": the same comparison in several cells, Holm-corrected: reproduced when Holm's step-down confirms
  every cell; not reproduced when it confirms, for some cell, the opposite (the not-reproduced condition above).
- Scale "ratio": the comparison is made on log values (a / b per replicate; margins and bands are ratios:
  margin 0.1 means a factor 1.1), and estimate and interval are reported back as ratios.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats

VERDICTS = ("reproduced", "not reproduced", "inconclusive")
Rule = Literal["superiority", "non-inferiority", "equivalence", "band", "exact"]
Scale = Literal["difference", "ratio"]
LEVEL = 0.95
MIN_REPLICATES = 3
BOOTSTRAP_FROM = 20
BOOTSTRAP_RESAMPLES = 10_000

Values = Sequence[float] | np.ndarray | float


@dataclass(frozen=True)
class Interval:
    """Mean of the replicates with a two-sided interval at `level`; `method` is "t", "bootstrap" or "none"."""

    estimate: float
    low: float
    high: float
    n: int
    method: str


def interval(values: Values, level: float = LEVEL) -> Interval:
    """The project's interval for the mean of `values`: t below 20 replicates, percentile bootstrap from 20."""
    v = np.asarray(values, dtype=float).ravel()
    if v.size == 0:
        raise ValueError("no replicates")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"non-finite replicate among {v.tolist()}")
    mean = float(v.mean())
    if v.size < 2:
        return Interval(mean, math.nan, math.nan, 1, "none")
    alpha = 1 - level
    if v.size >= BOOTSTRAP_FROM:
        idx = np.random.default_rng(0).integers(v.size, size=(BOOTSTRAP_RESAMPLES, v.size))
        low, high = np.quantile(v[idx].mean(1), [alpha / 2, 1 - alpha / 2])
        return Interval(mean, float(low), float(high), v.size, "bootstrap")
    half = float(stats.t.ppf(1 - alpha / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return Interval(mean, mean - half, mean + half, v.size, "t")


def one_sided_p(values: np.ndarray, boundary: float) -> float:
    """Evidence against "mean <= boundary" (small when the mean is clearly above it); orders Holm's cells."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if v.size >= BOOTSTRAP_FROM:
        idx = np.random.default_rng(0).integers(v.size, size=(BOOTSTRAP_RESAMPLES, v.size))
        return float((1 + np.sum(v[idx].mean(1) <= boundary)) / (BOOTSTRAP_RESAMPLES + 1))
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0
    if se == 0.0:
        return 0.0 if mean > boundary else 1.0
    return float(stats.t.sf((mean - boundary) / se, v.size - 1))


def slopes(x: Sequence[float] | np.ndarray, y: np.ndarray, log_x: bool = True, log_y: bool = True) -> np.ndarray:
    """Least-squares slope per replicate: y is (replicates, points), x is (points,) shared by every replicate or
    (replicates, points) of its own; log-log by default (rates, scaling laws)."""
    xs = np.log(np.asarray(x, dtype=float)) if log_x else np.asarray(x, dtype=float)
    ys = np.atleast_2d(np.asarray(y, dtype=float))
    ys = np.log(ys) if log_y else ys
    xc = xs - xs.mean(-1, keepdims=True)
    return ((ys - ys.mean(-1, keepdims=True)) * xc).sum(-1) / (xc * xc).sum(-1)


@dataclass(frozen=True)
class Claim:
    """A claim declared before its run. `margin`: the smallest effect of interest (superiority), the
    non-inferiority or equivalence margin; `band`: (low, high) for the band rule; `lower_is_better` for errors
    and losses; `post_hoc` when the claim was written after its results were seen."""

    name: str
    expected: str
    rule: Rule
    margin: float = 0.0
    band: tuple[float, float] | None = None
    scale: Scale = "difference"
    lower_is_better: bool = False
    post_hoc: bool = False
    tolerance: float = 0.0  # exact rule only

    def __post_init__(self) -> None:
        if self.rule in ("non-inferiority", "equivalence") and not self.margin > 0:
            raise ValueError(f"{self.name}: a {self.rule} claim needs a declared margin > 0")
        if self.rule == "band" and (self.band is None or not self.band[0] < self.band[1]):
            raise ValueError(f"{self.name}: a band claim needs band=(low, high) with low < high")
        if self.margin < 0:
            raise ValueError(f"{self.name}: margin must be >= 0")

    def _to_scale(self, x: float) -> float:
        return math.log(x) if self.scale == "ratio" else x

    def _from_scale(self, x: float) -> float:
        return math.exp(x) if self.scale == "ratio" else x

    def _log_margin(self) -> float:
        return math.log1p(self.margin) if self.scale == "ratio" else self.margin

    def differences(self, a: Values, b: Values = 0.0) -> np.ndarray:
        """Paired differences a - b (b may be a constant), or log(a / b) on the ratio scale."""
        a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if b_arr.ndim and a_arr.shape != b_arr.shape:
            raise ValueError(f"{self.name}: paired arms differ in shape {a_arr.shape} vs {b_arr.shape}")
        if self.scale == "ratio":
            if np.any(a_arr <= 0) or np.any(b_arr <= 0):
                raise ValueError(f"{self.name}: the ratio scale needs positive values")
            return np.ravel(np.log(a_arr) - np.log(b_arr))
        return np.ravel(a_arr - b_arr)

    def _gain(self, d: np.ndarray) -> np.ndarray:
        """Differences oriented so that larger means the claim's direction (A better than B)."""
        return -d if self.lower_is_better else d

    def _verdict(self, iv: Interval) -> str:
        """The rule applied to an interval of the differences (on the working scale)."""
        if iv.n < MIN_REPLICATES:
            return "inconclusive"
        low, high = (-iv.high, -iv.low) if self.lower_is_better else (iv.low, iv.high)
        m = self._log_margin()
        if self.rule == "superiority":
            return "reproduced" if low > 0 else "not reproduced" if high < m else "inconclusive"
        if self.rule == "non-inferiority":
            return "reproduced" if low > -m else "not reproduced" if high < -m else "inconclusive"
        if self.rule == "equivalence":
            return ("reproduced" if -m < iv.low and iv.high < m
                    else "not reproduced" if iv.low > m or iv.high < -m else "inconclusive")
        lo_b, hi_b = (self._to_scale(x) for x in self.band)  # band
        return ("reproduced" if lo_b <= iv.low and iv.high <= hi_b
                else "not reproduced" if iv.high < lo_b or iv.low > hi_b else "inconclusive")

    def _record(self, verdict: str, iv: Interval, measured: dict[str, Any], **extra: Any) -> dict[str, Any]:
        finite = iv.n > 1 and math.isfinite(iv.low)
        return {"name": self.name, "expected": self.expected, "verdict": verdict, "rule": self.rule,
                "n": iv.n, "estimate": _round(self._from_scale(iv.estimate)),
                "interval": [_round(self._from_scale(iv.low)), _round(self._from_scale(iv.high))] if finite else None,
                "interval_method": iv.method, "margin": self._declared_margin(), "scale": self.scale,
                "lower_is_better": self.lower_is_better, "post_hoc": self.post_hoc, **extra,
                "measured": _rounded(measured)}

    def _declared_margin(self) -> float | list[float] | None:
        if self.rule == "band":
            return [float(x) for x in self.band]
        if self.rule == "exact":
            return self.tolerance
        return self.margin

    def decide(self, a: Values, b: Values = 0.0, **measured: Any) -> dict[str, Any]:
        """The verdict on replicates `a` against paired replicates (or a constant) `b`; `measured` adds context
        (arm means, settings) to the record. For the exact rule, `a` is the measured value and `b` the expected."""
        if self.rule == "exact":
            value, target = float(np.asarray(a, dtype=float)), float(np.asarray(b, dtype=float))
            verdict = "reproduced" if abs(value - target) <= self.tolerance else "not reproduced"
            return self._record(verdict, Interval(value, value, value, 1, "exact"),
                                {"expected_value": target, **measured})
        iv = interval(self.differences(a, b))
        return self._record(self._verdict(iv), iv, measured)

    def decide_cells(self, cells: Mapping[str, tuple[Values, Values]], **measured: Any) -> dict[str, Any]:
        """The claim in every cell (cell -> (a, b)), Holm-corrected over the cells at the family level 0.05."""
        if self.rule not in ("superiority", "non-inferiority"):
            raise ValueError(f"{self.name}: 'in every cell' is for superiority or non-inferiority claims")
        gains = {c: self._gain(self.differences(a, b)) for c, (a, b) in cells.items()}
        m = self._log_margin()
        confirm_at = 0.0 if self.rule == "superiority" else -m  # the ordering holds: gain above this
        refute_at = m if self.rule == "superiority" else -m  # the ordering fails: gain below this
        small = min(g.size for g in gains.values())
        confirmed = _holm(gains, lambda g: g, confirm_at) if small >= MIN_REPLICATES else set()
        refuted = _holm(gains, lambda g: -g, -refute_at) if small >= MIN_REPLICATES else set()
        verdict = ("reproduced" if len(confirmed) == len(gains) else "not reproduced" if refuted
                   else "inconclusive")
        per_cell = {c: interval(self.differences(*cells[c])) for c in cells}
        worst = min(per_cell, key=lambda c: float(gains[c].mean()))
        cell_records = {c: {"estimate": _round(self._from_scale(iv.estimate)),
                            "interval": [_round(self._from_scale(iv.low)), _round(self._from_scale(iv.high))]
                            if iv.n > 1 else None, "confirmed": c in confirmed, "refuted": c in refuted}
                        for c, iv in per_cell.items()}
        return self._record(verdict, per_cell[worst], measured, cells=cell_records, worst_cell=worst,
                            holm={"confirmed": len(confirmed), "refuted": len(refuted), "cells": len(gains)})


def _holm(gains: dict[str, np.ndarray], orient, boundary: float, family: float = 1 - LEVEL) -> set[str]:
    """Holm's step-down over cells for "mean of orient(gain) > boundary": the cells it confirms. Each step checks
    the lower end of the cell's two-sided interval at level 1 - family / (cells left), as a single claim does."""
    values = {c: orient(g) for c, g in gains.items()}
    order = sorted(values, key=lambda c: (one_sided_p(values[c], boundary), c))
    confirmed: set[str] = set()
    for j, c in enumerate(order):
        iv = interval(values[c], 1 - family / (len(order) - j))
        if not iv.low > boundary:
            break
        confirmed.add(c)
    return confirmed


def superiority(name: str, expected: str, smallest_effect: float = 0.0, **kw: Any) -> Claim:
    """"A > B" (or A < B with lower_is_better=True)."""
    return Claim(name, expected, "superiority", margin=smallest_effect, **kw)


def non_inferiority(name: str, expected: str, margin: float, **kw: Any) -> Claim:
    """"A is not worse than B by more than `margin`" (one-sided)."""
    return Claim(name, expected, "non-inferiority", margin=margin, **kw)


def equivalence(name: str, expected: str, margin: float, **kw: Any) -> Claim:
    """"A equals B within +-margin" (two-sided)."""
    return Claim(name, expected, "equivalence", margin=margin, **kw)


def in_band(name: str, expected: str, low: float, high: float, **kw: Any) -> Claim:
    """"The quantity lies in [low, high]" (one sample, or a - b)."""
    return Claim(name, expected, "band", band=(low, high), **kw)


def exact(name: str, expected: str, tolerance: float = 0.0, **kw: Any) -> Claim:
    """A deterministic quantity equal to its expected value (within `tolerance`)."""
    return Claim(name, expected, "exact", tolerance=tolerance, **kw)


def not_run(claim: Claim, reason: str) -> dict[str, Any]:
    """The record of a declared claim whose data the run did not produce (a part switched off, too few levels)."""
    return claim._record("inconclusive", Interval(math.nan, math.nan, math.nan, 0, "none"), {"not_run": reason})


def comparison(record: Mapping[str, Any]) -> str:
    """A decided superiority record read as a comparison of A with B: "beats", "loses to" or "ties with"."""
    return {"reproduced": "beats", "not reproduced": "loses to", "inconclusive": "ties with"}[record["verdict"]]


def compared(claim: Claim, a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """A superiority `claim` of paired scores `a` over `b` decided, as {difference, interval, verdict} with the
    verdict read as a comparison ("beats", "loses to", "ties with")."""
    record = claim.decide(a, b)
    return {"difference": record["estimate"], "interval": record["interval"], "verdict": comparison(record)}


def confirmed(record: Mapping[str, Any]) -> bool:
    """Whether a decided claim's record says the claim holds (what later parts may condition a label on)."""
    return record["verdict"] == "reproduced"


def _round(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(f"{x:.6g}")


def _rounded(value: Any) -> Any:
    """Measured context for JSON: floats to 6 significant digits, non-finite as None, numpy scalars as Python."""
    if isinstance(value, Mapping):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_rounded(v) for v in value]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer | int):
        return int(value)
    if isinstance(value, np.floating | float):
        return _round(float(value))
    return value


def tagged(claim: Claim, tag: str = "", suffix: str = "", post_hoc: bool = False) -> Claim:
    """The declared claim as decided in one setting, "[tag] name suffix"; post hoc when that setting was added after
    its results were seen."""
    name = " ".join(p for p in (f"[{tag}]" if tag else "", claim.name, suffix) if p)
    return dataclasses.replace(claim, name=name, post_hoc=claim.post_hoc or post_hoc)
