"""The sentiment reproduction's "ground-truth" judge (standing in for the paper's RoBERTa-large scorer): TF-IDF word
uni+bigrams and a logistic regression fitted only on one held-out domain's labelled reviews (label = positive or
negative file; the experiment passes only reviews that are neither fine-tuning text nor in a pair), a feature space
deliberately unlike the MiniLM reward models it is used to judge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

from collabalign.data.amazon_reviews import Review, split_words
from collabalign.seeding import Seeds


class SentimentJudge:
    """P(positive) of a text; fitted on the response-shaped windows (the `response_words` words after the opening)
    of 1 - `test_fraction` of one domain's reviews, optionally also their full texts, and scored on the rest."""

    def __init__(self, opening_words: int = 2, response_words: int = 20, test_fraction: float = 0.2,
                 full_text: bool = True, c: float = 1.0, seed: int = 0) -> None:
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
        if c <= 0:
            raise ValueError(f"c must be > 0, got {c}")
        self.opening_words, self.response_words = opening_words, response_words
        self.test_fraction, self.full_text, self.c, self.seed = test_fraction, full_text, c, seed
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
        self.model = LogisticRegression(C=c, solver="liblinear", random_state=0)
        self.domain: str | None = None
        self.n_train = self.n_test = 0
        self.accuracy = self.accuracy_full = float("nan")  # held-out accuracy on response windows / full texts
        self.pair_accuracy = float("nan")  # share of preference pairs whose chosen reply it scores higher

    def fit(self, reviews: Sequence[Review]) -> SentimentJudge:
        """Fit on one domain's reviews (a seeded split by review) and record the held-out window accuracy."""
        domains = {r.domain for r in reviews}
        if len(domains) != 1:
            raise ValueError(f"the judge is fitted on exactly one held-out domain, got {sorted(domains) or 'none'}")
        rows = [(w[1], r.text, r.label) for r in reviews
                if (w := split_words(r.text, self.opening_words, self.response_words)) is not None]
        domain = domains.pop()
        order = Seeds(self.seed).numpy("sentiment_judge.split", domain).permutation(len(rows))
        n_test = max(1, int(round(self.test_fraction * len(rows))))
        if n_test >= len(rows):
            raise ValueError(f"too few usable reviews ({len(rows)}) for a train/test split")
        test, train = [rows[j] for j in order[:n_test]], [rows[j] for j in order[n_test:]]
        labels = [label for _, _, label in train]
        if set(labels) != {0, 1}:
            raise ValueError(f"the judge's training split needs both labels, got {sorted(set(labels))}")
        texts = [w for w, _, _ in train] + ([t for _, t, _ in train] if self.full_text else [])
        self.model.fit(self.vectorizer.fit_transform(texts), np.asarray(labels * (2 if self.full_text else 1)))
        self.domain = domain
        self.n_train, self.n_test = len(train), len(test)
        truth = np.asarray([y for _, _, y in test], dtype=bool)
        self.accuracy = float(np.mean((self.score([w for w, _, _ in test]) >= 0.5) == truth))
        self.accuracy_full = float(np.mean((self.score([t for _, t, _ in test]) >= 0.5) == truth))
        return self

    def score(self, texts: Sequence[str]) -> np.ndarray:
        """P(positive) in [0, 1] for each text, as float64."""
        if self.domain is None:
            raise RuntimeError("SentimentJudge.score called before fit")
        if not len(texts):
            return np.zeros(0)
        positive = list(self.model.classes_).index(1)
        return self.model.predict_proba(self.vectorizer.transform(list(texts)))[:, positive].astype(np.float64)

    def score_pairs(self, chosen: Sequence[str], rejected: Sequence[str]) -> SentimentJudge:
        """Records `pair_accuracy`: the share of pairs whose chosen text it scores above the rejected (ties lose)."""
        if len(chosen) != len(rejected) or not len(chosen):
            raise ValueError(f"need as many chosen as rejected texts, at least one; got {len(chosen)}, {len(rejected)}")
        self.pair_accuracy = float(np.mean(self.score(chosen) > self.score(rejected)))
        return self

    def describe(self) -> dict[str, Any]:
        """The judge's settings and held-out accuracy, for the run's metrics."""
        return {"kind": "tfidf-logreg", "domain": self.domain, "accuracy": self.accuracy,
                "accuracy_full_text": self.accuracy_full, "pair_accuracy": self.pair_accuracy,
                "n_train": self.n_train,
                "n_test": self.n_test, "vocabulary": len(getattr(self.vectorizer, "vocabulary_", {})),
                "opening_words": self.opening_words, "response_words": self.response_words,
                "full_text": self.full_text, "c": self.c, "test_fraction": self.test_fraction, "seed": self.seed}
