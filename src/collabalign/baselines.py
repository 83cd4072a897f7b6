"""The baseline beside every result: what a practitioner would try first, scored on the same held-out items as the
trained model, and the difference decided by the claims rule (`claims.py`, superiority: the interval's lower end
above 0).

`compare` turns paired per-item scores (ours, the baseline's) into the record `result.metrics["baseline"]` holds and
the sentence the CLI prints last. `bt_probe` is the reward models' baseline: a linear Bradley-Terry probe on frozen
features (the backbone with no LoRA, pooled as the reward model pools), its L2 strength chosen by cross-validation
on the training pairs only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression, Ridge

from collabalign.claims import compared, superiority
from collabalign.models.text_reward import LinearHead, fit_bradley_terry, standardiser

BEATS = superiority("beats_baseline", "the trained model scores above its baseline on the same held-out items")
PROBE_C = (0.01, 0.1, 1.0)  # the probes' inverse L2 strengths; one is chosen per fit on the training pairs
PROBE_FOLDS = 5


def compare(metric: str, ours: Sequence[float] | np.ndarray, baseline: Sequence[float] | np.ndarray, name: str,
            groups: Sequence[int] | np.ndarray | None = None, lower_is_better: bool = False) -> dict[str, Any]:
    """The record of "ours beats `name` on `metric`": per held-out item scores of both (paired), their means, the
    difference with its interval and the claims rule's verdict. With `groups` (an index per item, e.g. its user)
    every group weighs the same, as a per-user mean does: the items' differences are reweighted so their mean is the
    mean over groups of each group's mean difference."""
    a, b = np.asarray(ours, dtype=float).ravel(), np.asarray(baseline, dtype=float).ravel()
    if a.shape != b.shape or not a.size:
        raise ValueError(f"baseline comparison needs paired scores, got {a.size} and {b.size}")
    weight = np.ones(a.size)
    if groups is not None:
        g = np.asarray(groups).ravel()
        _, index, counts = np.unique(g, return_inverse=True, return_counts=True)
        weight = a.size / (len(counts) * counts[index])
    claim = BEATS if not lower_is_better else superiority(BEATS.name, BEATS.expected, lower_is_better=True)
    return {"metric": metric, "baseline": name, "ours": _r(np.mean(weight * a)),
            "baseline_value": _r(np.mean(weight * b)), "items": int(a.size),
            **compared(claim, weight * a, weight * b)}  # difference, interval and verdict, decided by claims.py


def sentence(method: str, record: dict[str, Any]) -> str:
    """One plain line: the method's score against its baseline's, the difference with its interval, and whether it
    beats it."""
    iv = record["interval"]
    span = f" [{iv[0]:+.3f}, {iv[1]:+.3f}]" if iv else ""
    verdict = {"beats": "it beats its baseline",
               "loses to": "it does NOT beat its baseline: the baseline is better",
               "ties with": "it does NOT beat its baseline (the interval holds 0)"}
    return (f"{method}: {record['metric']} {record['ours']:.3f} against {record['baseline_value']:.3f} for "
            f"{record['baseline']} on the same {record['items']} held-out items: difference "
            f"{record['difference']:+.3f}{span}; {verdict[record['verdict']]}")


def bt_probe(chosen: np.ndarray, rejected: np.ndarray, rng: np.random.Generator) -> LinearHead:
    """A Bradley-Terry probe on the training pairs' features, its C chosen on those pairs (`_strength`)."""
    def score(fit: np.ndarray, held: np.ndarray, c: float) -> float:
        return probe_hits(fit_bradley_terry(chosen[fit], rejected[fit], c), chosen[held], rejected[held]).mean()

    return fit_bradley_terry(chosen, rejected, _strength(len(chosen), rng, score))


def probe_pairs(features: np.ndarray, chosen: np.ndarray, rejected: np.ndarray, train: np.ndarray, test: np.ndarray,
                rng: np.random.Generator, groups: np.ndarray | None = None) -> np.ndarray:
    """Per test pair, the hits of a `bt_probe` fitted on the training pairs (on its own group's training pairs when
    `groups` gives a group per pair: a probe per user). `chosen[k]`, `rejected[k]`: pair k's rows of `features`;
    `train`, `test`: pair indices."""
    group = np.zeros(len(chosen), dtype=int) if groups is None else np.asarray(groups)
    hits = np.empty(len(test))
    for g in np.unique(group[test]):
        fit, scored = train[group[train] == g], group[test] == g
        head = bt_probe(features[chosen[fit]], features[rejected[fit]], rng)
        hits[scored] = probe_hits(head, features[chosen[test[scored]]], features[rejected[test[scored]]])
    return hits


def label_probe(features: np.ndarray, labels: np.ndarray, train: np.ndarray, test: np.ndarray,
                rng: np.random.Generator, regression: bool = False) -> np.ndarray:
    """The classifiers' baseline, per test example: 1 when a logistic probe on the frozen features predicts its class,
    else 0 (with `regression`: a ridge probe's squared error), the probe fitted on the training rows with its strength
    from `PROBE_C` by `PROBE_FOLDS`-fold cross-validation on them (ties to the stronger regularisation)."""
    mean, scale = standardiser(features[train])
    x, y = (features - mean) / scale, np.asarray(labels)

    def fit(rows: np.ndarray, c: float):
        model = Ridge(alpha=1 / c) if regression else LogisticRegression(C=c, max_iter=2000)
        return model.fit(x[rows], y[rows])

    def scores(model, rows: np.ndarray) -> np.ndarray:
        predicted = model.predict(x[rows])
        return (predicted - y[rows]) ** 2 if regression else (predicted == y[rows]).astype(float)

    def score(fitted: np.ndarray, held: np.ndarray, c: float) -> float | None:
        if not regression and len(np.unique(y[train[fitted]])) < 2:
            return None  # a fold whose training part holds one class cannot be fitted
        return scores(fit(train[fitted], c), train[held]).mean()

    return scores(fit(train, _strength(len(train), rng, score, lower=regression)), test)


def _strength(n: int, rng: np.random.Generator, score: Callable[[np.ndarray, np.ndarray, float], float | None],
              lower: bool = False) -> float:
    """A probe's C from `PROBE_C` by `PROBE_FOLDS`-fold cross-validation over n training rows: `score(fit, held, c)`
    (boolean masks) is a fold's mean score, None for a fold that cannot be fitted; ties go to the stronger
    regularisation; 0.1 when fewer than 2 rows a fold or no usable fold."""
    folds = min(PROBE_FOLDS, n // 2)
    if folds < 2:
        return 0.1
    fold = rng.permutation(n) % folds
    cv = {c: [s for k in range(folds) if (s := score(fold != k, fold == k, c)) is not None] for c in PROBE_C}
    if not cv[PROBE_C[0]]:
        return 0.1
    sign = 1.0 if lower else -1.0
    return min(PROBE_C, key=lambda c: (sign * float(np.mean(cv[c])), c))


def probe_hits(head: LinearHead, chosen: np.ndarray, rejected: np.ndarray) -> np.ndarray:
    """Per pair: 1 when the probe ranks the chosen reply higher, 0.5 for a tie, else 0."""
    a, b = head.logit(chosen), head.logit(rejected)
    return (a > b) + 0.5 * (a == b)


def _r(x: float) -> float:
    return round(float(x), 6)
