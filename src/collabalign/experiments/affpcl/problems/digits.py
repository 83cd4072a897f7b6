"""Users of the digits substitute for the paper's FEMNIST experiment (Fig. 2; spec §5.2, §8.2, §9 item 13), as an
AffPCL problem (problem.py) on the pre-trained features of `data.digit_features`.

Two class attributes replace FEMNIST's "digit" and "curved letter": a1 = 1{digit in {0, 6, 8, 9}} (a closed loop) and
a2 = 1{digit >= 5}. User i's label is y^i = lambda^i a1 + (1 - lambda^i) a2, lambda^i evenly spaced in
[0.5 - delta_obj / 2, 0.5 + delta_obj / 2] (objective heterogeneity). Users also see different data (environment
heterogeneity, like FEMNIST's writers): user i draws a class c ~ p^i = (1 - skew) uniform + skew Dirichlet(conc), then
a uniform training image of class c, so the density ratio rho^i(item) = p^i(c) / (1/n) sum_j p^j(c) is exact.

Least squares per user: A(s) = phi phi^T, b^i(s) = phi y^i over a minibatch; the central objective is the oracle
y^c = lambda-bar a1 + (1 - lambda-bar) a2 (§9 item 13). The metric is each user's test MSE under its own class
mixture and label, evaluated exactly from per-class test moments.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from collabalign.data.digit_features import DigitFeatures

LOOP = np.array([1.0, 0, 0, 0, 0, 0, 1, 0, 1, 1])  # a1: digits 0, 6, 8, 9
HIGH = (np.arange(10) >= 5).astype(float)  # a2: digits >= 5


class DigitsBatch(NamedTuple):
    cls: np.ndarray  # classes (R, n, B)
    phi: np.ndarray  # features (R, n, B, d)
    y: np.ndarray  # each user's labels (R, n, B)


def _residual(phi: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minibatch least-squares direction mean_b phi_b (phi_b . w - y_b): phi (R, n, B, d), w (R, n, d) or (R, d)."""
    if w.ndim == 2:
        w = w[:, None]
    return np.einsum("rnbd,rnb->rnd", phi, np.einsum("rnbd,rnd->rnb", phi, w) - y) / phi.shape[2]


class DigitsUsers:
    """R runs of n users at one delta_obj, drawing minibatches of `batch` images per step: class mixtures p (R, n, 10),
    lambdas (n,), per-class labels y (R, n, 10), exact density ratios per class (R, n, 10) and test-MSE moments."""

    def __init__(self, feats: DigitFeatures, rng: np.random.Generator, runs: int, n: int, delta_obj: float,
                 skew: float = 0.5, concentration: float = 0.5, batch: int = 32):
        self.feats, self.runs, self.n, self.d, self.batch = feats, runs, n, feats.d, batch
        dirichlet = rng.dirichlet(np.full(10, concentration), size=(runs, n))
        self.p = (1 - skew) / 10 + skew * dirichlet
        self.lam = 0.5 + delta_obj * (np.linspace(-0.5, 0.5, n) if n > 1 else np.zeros(1))
        self.y = np.broadcast_to(self.lam[:, None] * LOOP + (1 - self.lam[:, None]) * HIGH, (runs, n, 10))
        self.y_central = self.lam.mean() * LOOP + (1 - self.lam.mean()) * HIGH  # oracle central objective, (10,)
        self.rho = self.p / self.p.mean(1, keepdims=True)
        self.cum = np.cumsum(self.p, axis=-1)
        self.test_cov = np.einsum("rnc,cde->rnde", self.p, feats.test_second)
        self.test_lin = np.einsum("rnc,rnc,cd->rnd", self.p, self.y, feats.test_first)
        self.test_const = np.einsum("rnc,rnc->rn", self.p, self.y**2)

    def classes_and_features(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Minibatches from uniforms u (R, n, B, 2): classes (R, n, B) and feature rows (R, n, B, d)."""
        cls = np.minimum((self.cum[:, :, None, :] < u[..., :1]).sum(-1), 9)
        pos = np.minimum((u[..., 1] * self.feats.class_size[cls]).astype(int), self.feats.class_size[cls] - 1)
        return cls, self.feats.phi[self.feats.members[cls, pos]]

    def test_mse(self, x: np.ndarray) -> np.ndarray:
        """Each user's test MSE under its own class mixture and label, (R, n); x is (R, n, d) or a common (R, d)."""
        if x.ndim == 2:
            x = np.broadcast_to(x[:, None], (self.runs, self.n, self.d))
        quad = np.einsum("rnd,rnde,rne->rn", x, self.test_cov, x)
        return quad - 2 * np.einsum("rnd,rnd->rn", self.test_lin, x) + self.test_const

    # the problem interface (problem.py)

    def draw(self, steps: int, rng: np.random.Generator) -> np.ndarray:
        """The uniforms of every step's minibatches, (T, R, n, B, 2)."""
        return rng.uniform(size=(steps, self.runs, self.n, self.batch, 2))

    def sample(self, draws: np.ndarray, t: int, models: np.ndarray) -> DigitsBatch:
        cls, phi = self.classes_and_features(draws[t])
        return DigitsBatch(cls, phi, np.take_along_axis(self.y, cls, axis=-1))

    def grad(self, x: np.ndarray, batch: DigitsBatch) -> np.ndarray:
        return _residual(batch.phi, x, batch.y)

    error = test_mse

    def central_start(self, central: str, weights: str) -> None:
        if central != "oracle":
            raise ValueError("digits users: only the oracle central objective (spec §9 item 13)")
        return None

    def bias_correction(self, xc: np.ndarray, est: None, batch: DigitsBatch) -> np.ndarray:
        return _residual(batch.phi, xc, self.y_central[batch.cls])

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: None, batch: DigitsBatch, x: np.ndarray,
                             weights: str) -> np.ndarray:
        """Exact class ratios: each sample's central direction summed per class, weighted by rho^i(class)."""
        if weights != "exact":
            raise ValueError(f"digits users: unknown density ratios {weights!r}")
        phi, cls = batch.phi, batch.cls
        per = np.einsum("rnbd,rnb->rnbd", phi, np.einsum("rnbd,rd->rnb", phi, xc) - self.y_central[cls])
        by_class = np.einsum("rnbc,rnbd->rcd", np.eye(10)[cls], per) / self.batch  # sum_j mean_b per class
        return np.einsum("ric,rcd->rid", self.rho, by_class) / self.n

    def coe(self, est: None, batch: DigitsBatch, a: np.ndarray) -> None:
        return None
