"""Simulated labelers over measurable text attributes (docs/methods/pshare-lora.md §8.4): labeler i weighs the attribute
vector a(x) by w_i = M c_i with a shared M (m x 2), c_i = sqrt(rho) c_bar + sqrt(1 - rho) z_i (plus an optional
individual tail eta * xi_i), and labels a pair o ~ Bernoulli(sigmoid(beta w_i^T (a(x0) - a(x1)))), with beta calibrated
from the data so that the oracle accuracy E[sigmoid(beta |margin|)] hits a target."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AttributePairs:
    """Texts (optionally text pairs: `second`) with standardised attributes (n_texts, m), and comparisons: the
    labeler of each pair, the rows of its two texts (x0, x1) and whether it is a training pair."""

    texts: list[str]
    second: list[str] | None
    attributes: np.ndarray
    names: tuple[str, ...]
    users: np.ndarray
    first: np.ndarray
    other: np.ndarray
    train: np.ndarray

    def margins(self, weights: np.ndarray) -> np.ndarray:
        """w_user^T (a(x0) - a(x1)) for every pair."""
        return ((self.attributes[self.first] - self.attributes[self.other]) * weights[self.users]).sum(1)


def standardise(raw: np.ndarray) -> np.ndarray:
    """Each attribute centred and scaled to unit std over the texts (a constant attribute stays 0)."""
    std = raw.std(0)
    return (raw - raw.mean(0)) / np.where(std > 0, std, 1.0)


def labeler_weights(m: int, n: int, rho: float, tail: float, rng: np.random.Generator, camps: bool = False
                    ) -> np.ndarray:
    """(n, m) weights w_i = M c_i + tail * xi_i, M ~ N(0, 1/2) (m x 2), c_bar, z_i, xi_i ~ N(0, I); with `camps` the
    odd-numbered labelers negate theirs (two camps that disagree however close rho makes them)."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    shared = rng.standard_normal((m, 2)) / np.sqrt(2)
    c = np.sqrt(rho) * rng.standard_normal(2) + np.sqrt(1 - rho) * rng.standard_normal((n, 2))
    weights = c @ shared.T + tail * rng.standard_normal((n, m))
    if camps:
        weights[1::2] *= -1
    return weights


def oracle_accuracy(beta: float, margins: np.ndarray) -> float:
    """Expected agreement of a BTL label with the sign of its margin: mean sigmoid(beta |margin|) (ties 0.5)."""
    return float(np.mean(1.0 / (1.0 + np.exp(-beta * np.abs(margins)))))


def calibrate_beta(margins: np.ndarray, target: float, iterations: int = 200) -> float:
    """The beta with oracle_accuracy(beta, margins) = target, by bisection on log beta in [1e-6, 1e6]."""
    lo, hi = np.log(1e-6), np.log(1e6)
    if not oracle_accuracy(np.exp(lo), margins) <= target <= oracle_accuracy(np.exp(hi), margins):
        raise ValueError(f"oracle accuracy {target} is out of reach: the margins allow at most "
                         f"{oracle_accuracy(np.exp(hi), margins):.4f} (ties count 0.5)")
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if oracle_accuracy(np.exp(mid), margins) < target else (lo, mid)
    return float(np.exp((lo + hi) / 2))


def draw_labels(pairs: AttributePairs, weights: np.ndarray, beta: float,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(chosen rows, rejected rows, true reward margin chosen - rejected) with o ~ Bernoulli(sigmoid(beta margin))."""
    margin = pairs.margins(weights)
    o = rng.random(len(margin)) < 1.0 / (1.0 + np.exp(-beta * margin))
    chosen = np.where(o, pairs.first, pairs.other)
    rejected = np.where(o, pairs.other, pairs.first)
    return chosen, rejected, np.where(o, margin, -margin)


def describe(weights: np.ndarray, names: tuple[str, ...]) -> list[str]:
    """One line per labeler: its weights, largest in magnitude first."""
    out = []
    for i, w in enumerate(weights):
        order = np.argsort(-np.abs(w))
        out.append(f"labeler {i}: " + ", ".join(f"{names[j]} {w[j]:+.2f}" for j in order))
    return out
