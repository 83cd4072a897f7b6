"""Fitting FIRM's text rewards on PKU-SafeRLHF with their held-out accuracy (folds over prompts, so both replies of
a prompt are always on the same side):

- harmlessness: P(safe | prompt, reply), a logistic head on the 2 x rows per-reply `is_response_*_safe` labels,
  against chance (0.5) and the base rate (always the training fold's majority label);
- helpfulness: Bradley–Terry heads on `better_response_id`, one per HELPFUL_CANDIDATES entry, chosen by nested
  cross-validation (an inner CV on each outer training fold picks; the outer fold scores), against chance and
  "the longer reply wins"; the inner-CV runner-up is the differently trained alternative model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collabalign.claims import interval
from collabalign.data.pku_saferlhf import PkuRow
from collabalign.models.text_reward import (
    FEATURE_SETS,
    FeatureReward,
    LinearHead,
    SentenceEncoder,
    features,
    fit_bradley_terry,
    fit_logistic,
)
from collabalign.seeding import Seeds

# name -> (feature set, inverse L2 strength C on standardised features); the order breaks ties in the inner CV
HELPFUL_CANDIDATES: dict[str, tuple[str, float]] = {
    "length": ("length", 1.0),
    "style": ("style", 1.0),
    "minilm": ("reply_prompt", 0.01),
    "length_minilm": ("length_reply_prompt", 0.01),
}
SAFETY_FEATURES = "reply_prompt"
SAFETY_C = 0.1
CHANCE = 0.5
FOLDS_PURPOSE = "pku-folds"  # both objectives use the same outer folds, so a fold's numbers line up

Pair = tuple[np.ndarray, np.ndarray]  # features of response_0 and response_1 of every row


@dataclass(frozen=True)
class Fold:
    """One outer replicate: repeat r, fold k, the row indices it trains and tests on."""

    repeat: int
    fold: int
    train: np.ndarray
    test: np.ndarray


def cv_folds(n: int, folds: int, repeats: int, seeds: Seeds, purpose: str) -> list[Fold]:
    """`repeats` seeded permutations of range(n), each cut into `folds` test folds (sizes differ by at most 1)."""
    if not 2 <= folds <= n:
        raise ValueError(f"need 2 <= folds <= {n}, got {folds}")
    out = []
    for r in range(repeats):
        perm = seeds.numpy(purpose, r).permutation(n)
        for k in range(folds):
            test = np.sort(perm[k::folds])
            out.append(Fold(r, k, np.setdiff1d(perm, test), test))
    return out


def row_features(rows: list[PkuRow], feature_set: str, encoder: SentenceEncoder | None) -> Pair:
    """The feature set of response_0 and of response_1 of every row (their embeddings are remembered)."""
    prompts = [r.prompt for r in rows]
    if encoder is not None and FEATURE_SETS[feature_set][0]:
        encoder([t for r in rows for t in (r.response_0, r.response_1)], remember=True)
    return (features(feature_set, prompts, [r.response_0 for r in rows], encoder),
            features(feature_set, prompts, [r.response_1 for r in rows], encoder))


def _labels(rows: list[PkuRow], label: str) -> np.ndarray:
    return np.array([getattr(r, label) for r in rows], dtype=int)


def _chosen_rejected(x: Pair, pick: np.ndarray, idx: np.ndarray) -> Pair:
    """(features of the preferred reply, of the other) for rows idx, where pick[i] is the preferred id."""
    first = pick[idx] == 0
    x0, x1 = x[0][idx], x[1][idx]
    return np.where(first[:, None], x0, x1), np.where(first[:, None], x1, x0)


def pair_accuracy(score_0: np.ndarray, score_1: np.ndarray, pick: np.ndarray) -> float:
    """Share of rows whose preferred reply scores higher (ties half right)."""
    diff = np.where(pick == 1, score_1 - score_0, score_0 - score_1)
    return float(np.mean((diff > 0) + 0.5 * (diff == 0)))


def length_only(rows: list[PkuRow], label: str = "better_response_id") -> np.ndarray:
    """Per row: 1 when the longer reply (characters) is the preferred one, 0 when shorter, 0.5 on a tie."""
    n0 = np.array([len(r.response_0) for r in rows])
    n1 = np.array([len(r.response_1) for r in rows])
    pick = _labels(rows, label)
    diff = np.where(pick == 1, n1 - n0, n0 - n1)
    return (diff > 0) + 0.5 * (diff == 0)


def _bt(x: Pair, pick: np.ndarray, idx: np.ndarray, c: float) -> LinearHead:
    return fit_bradley_terry(*_chosen_rejected(x, pick, idx), c)


def _bt_accuracy(head: LinearHead, x: Pair, pick: np.ndarray, idx: np.ndarray) -> float:
    return pair_accuracy(head.logit(x[0][idx]), head.logit(x[1][idx]), pick[idx])


def _inner_ranking(xs: dict[str, Pair], pick: np.ndarray, idx: np.ndarray, folds: int, seeds: Seeds,
                   party: str) -> dict[str, float]:
    """Mean inner-CV pair accuracy of each candidate on rows idx only (the inner folds never see other rows)."""
    inner = cv_folds(len(idx), folds, 1, seeds, f"helpful-inner/{party}")
    return {name: float(np.mean([_bt_accuracy(_bt(xs[name], pick, idx[f.train], HELPFUL_CANDIDATES[name][1]),
                                              xs[name], pick, idx[f.test]) for f in inner]))
            for name in xs}


def _top_two(ranking: dict[str, float]) -> tuple[str, str]:
    """Best and runner-up by inner accuracy; ties go to the earlier candidate (HELPFUL_CANDIDATES order)."""
    order = sorted(ranking, key=lambda name: -ranking[name])  # sorted is stable: equal scores keep their order
    return order[0], order[1]


def summary(values: np.ndarray | list[float]) -> dict[str, Any]:
    """Mean and 95% interval (the project's rule) of per-fold values."""
    iv = interval(values)
    return {"mean": iv.estimate, "low": iv.low, "high": iv.high, "n": iv.n}


@dataclass
class HarmlessFit:
    """The fitted P(safe) reward and its per-fold held-out numbers (per-reply accuracy, base rate; pairwise
    accuracy on `safer_response_id` and the length-only baseline on it)."""

    model: FeatureReward
    accuracy: np.ndarray
    base_rate: np.ndarray
    safer_pair_accuracy: np.ndarray
    safer_length_only: np.ndarray

    def metrics(self) -> dict[str, Any]:
        return {"model": self.model.name, "feature_set": self.model.feature_set, "c": SAFETY_C, "chance": CHANCE,
                "accuracy": summary(self.accuracy), "base_rate": summary(self.base_rate),
                "safer_pair_accuracy": summary(self.safer_pair_accuracy),
                "safer_length_only": summary(self.safer_length_only)}


def fit_harmless(rows: list[PkuRow], encoder: SentenceEncoder, seeds: Seeds, folds: int = 5,
                 repeats: int = 2) -> HarmlessFit:
    """P(safe | prompt, reply) on every labelled reply, held-out accuracy per fold, then the model refitted on all
    rows."""
    x = row_features(rows, SAFETY_FEATURES, encoder)
    safe = np.array([r.safe for r in rows], dtype=int)  # (n, 2)
    safer = _labels(rows, "safer_response_id")
    longer = length_only(rows, "safer_response_id")
    acc, base, pair, length = [], [], [], []
    for f in cv_folds(len(rows), folds, repeats, seeds, FOLDS_PURPOSE):
        head = fit_logistic(np.vstack([x[0][f.train], x[1][f.train]]), safe[f.train].T.ravel(), SAFETY_C)
        p0, p1 = head.logit(x[0][f.test]), head.logit(x[1][f.test])
        y = safe[f.test]
        acc.append(float(np.mean(np.c_[p0 > 0, p1 > 0] == y)))
        majority = int(safe[f.train].mean() >= 0.5)
        base.append(float(np.mean(y == majority)))
        pair.append(pair_accuracy(p0, p1, safer[f.test]))
        length.append(float(longer[f.test].mean()))
    head = fit_logistic(np.vstack(x), safe.T.ravel(), SAFETY_C)
    model = FeatureReward("harmless_minilm_logistic", SAFETY_FEATURES, head, encoder)
    return HarmlessFit(model, np.array(acc), np.array(base), np.array(pair), np.array(length))


@dataclass
class HelpfulFit:
    """The chosen helpfulness reward, the inner-CV runner-up (the alternative model), and per outer fold: the
    nested (selected) accuracy, the alternative's, every candidate's, and the length-only baseline."""

    model: FeatureReward
    alternative: FeatureReward
    nested: np.ndarray
    nested_alternative: np.ndarray
    candidates: dict[str, np.ndarray]
    length_only: np.ndarray
    selected: list[str] = field(default_factory=list)
    runner_up: list[str] = field(default_factory=list)
    final_ranking: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        return {"chosen": self.model.name, "alternative": self.alternative.name, "chance": CHANCE,
                "selection": "nested CV: the inner CV on each outer training fold picks; ties go to the simpler "
                             "candidate (order: " + ", ".join(HELPFUL_CANDIDATES) + ")",
                "selected_per_fold": dict(Counter(self.selected)), "runner_up_per_fold": dict(Counter(self.runner_up)),
                "final_inner_ranking": self.final_ranking,
                "nested_accuracy": summary(self.nested),
                "alternative_nested_accuracy": summary(self.nested_alternative),
                "length_only": summary(self.length_only),
                "candidates": {name: {"feature_set": HELPFUL_CANDIDATES[name][0], "c": HELPFUL_CANDIDATES[name][1],
                                      "accuracy": summary(v)} for name, v in self.candidates.items()}}


def fit_helpful(rows: list[PkuRow], encoder: SentenceEncoder, seeds: Seeds, folds: int = 5, repeats: int = 2,
                inner_folds: int = 5, candidates: tuple[str, ...] = tuple(HELPFUL_CANDIDATES)) -> HelpfulFit:
    """Bradley–Terry helpfulness rewards on `better_response_id`: nested CV for the held-out numbers, then the
    inner CV on all rows picks the final model (best) and the alternative (runner-up), both refitted on all rows."""
    unknown = [c for c in candidates if c not in HELPFUL_CANDIDATES]
    if unknown or len(candidates) < 2:
        raise ValueError(f"need >= 2 candidates from {list(HELPFUL_CANDIDATES)}, got {list(candidates)}")
    needed = {HELPFUL_CANDIDATES[c][0] for c in candidates}
    by_set = {s: row_features(rows, s, encoder if FEATURE_SETS[s][0] else None) for s in needed}
    xs = {c: by_set[HELPFUL_CANDIDATES[c][0]] for c in candidates}
    pick = _labels(rows, "better_response_id")
    longer = length_only(rows)
    per_candidate: dict[str, list[float]] = {c: [] for c in candidates}
    nested, alt, length, selected, runner_up = [], [], [], [], []
    for f in cv_folds(len(rows), folds, repeats, seeds, FOLDS_PURPOSE):
        for c in candidates:
            per_candidate[c].append(_bt_accuracy(_bt(xs[c], pick, f.train, HELPFUL_CANDIDATES[c][1]), xs[c], pick,
                                                 f.test))
        best, second = _top_two(_inner_ranking(xs, pick, f.train, inner_folds, seeds, f"{f.repeat}/{f.fold}"))
        selected.append(best)
        runner_up.append(second)
        nested.append(per_candidate[best][-1])
        alt.append(per_candidate[second][-1])
        length.append(float(longer[f.test].mean()))
    everything = np.arange(len(rows))
    ranking = _inner_ranking(xs, pick, everything, inner_folds, seeds, "all")
    best, second = _top_two(ranking)

    def refit(name: str, role: str) -> FeatureReward:
        feature_set, c = HELPFUL_CANDIDATES[name]
        return FeatureReward(f"{role}_{name}_bt", feature_set, _bt(xs[name], pick, everything, c),
                             encoder if FEATURE_SETS[feature_set][0] else None)

    return HelpfulFit(refit(best, "helpful"), refit(second, "helpful_alt"), np.array(nested), np.array(alt),
                      {c: np.array(v) for c, v in per_candidate.items()}, np.array(length), selected, runner_up,
                      ranking)
