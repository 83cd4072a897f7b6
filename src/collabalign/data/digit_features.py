"""Pre-trained features of scikit-learn's bundled 8x8 digits: the real-data substitute for FEMNIST in AffPCL's Fig. 2
(docs/methods/affpcl.md §5.2, §8.2, §9.13).

An MLP with one hidden layer of 84 ReLU units is pre-trained on 40% of the images; its hidden activations, scaled so
that max ||phi|| = 1, are the shared features phi in R^84 of the other images, split into a training pool and a test
set. Per-class test moments let a linear model's test MSE be evaluated exactly for any class mixture.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np


class DigitFeatures:
    """Pre-trained 84-d features of the digits not used for pre-training, split into a training pool and a test set;
    per-class test moments for exact test MSE."""

    def __init__(self, seed: int, hidden: int = 84, pretrain_share: float = 0.4, test_share: float = 0.3,
                 max_iter: int = 200):
        from sklearn.datasets import load_digits
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
        order = np.random.default_rng(seed).permutation(len(y))
        k = int(pretrain_share * len(y))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            mlp = MLPClassifier(hidden_layer_sizes=(hidden,), max_iter=max_iter, random_state=seed)
            mlp.fit(x[order[:k]], y[order[:k]])
        rest = order[k:]
        self.pretrain_accuracy = float(mlp.score(x[rest], y[rest]))
        phi = np.maximum(x[rest] @ mlp.coefs_[0] + mlp.intercepts_[0], 0.0)
        phi /= np.linalg.norm(phi, axis=1).max()
        n_test = int(test_share * len(rest))
        self.phi, self.labels = phi[n_test:], y[rest][n_test:]
        self.test_phi, self.test_labels = test_phi, test_labels = phi[:n_test], y[rest][:n_test]
        self.d = phi.shape[1]
        self.by_class = [np.flatnonzero(self.labels == c) for c in range(10)]
        self.class_size = np.array([len(c) for c in self.by_class])
        self.members = np.zeros((10, self.class_size.max()), dtype=int)
        for c, idx in enumerate(self.by_class):
            self.members[c, : len(idx)] = idx
        # test moments per class: E[phi phi^T | c], E[phi | c]
        self.test_second = np.stack([np.einsum("kd,ke->de", test_phi[test_labels == c], test_phi[test_labels == c])
                                     / max((test_labels == c).sum(), 1) for c in range(10)])
        self.test_first = np.stack([test_phi[test_labels == c].mean(0) for c in range(10)])


@lru_cache(maxsize=4)
def digit_features(seed: int) -> DigitFeatures:
    """DigitFeatures(seed), built once per process (pre-training is deterministic in the seed; treat as read-only)."""
    return DigitFeatures(seed)
