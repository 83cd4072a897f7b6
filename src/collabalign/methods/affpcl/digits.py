"""The real-data substitute for the paper's FEMNIST experiment (Fig. 2; spec §5.2, §8.2, §9 item 13).

scikit-learn's bundled 8x8 digits: an MLP with one hidden layer of 84 ReLU units is pre-trained on 40% of the images;
its hidden activations, scaled so that max ||phi|| = 1, are the shared features phi in R^84 of the other images. Two
class attributes replace FEMNIST's "digit" and "curved letter": a1 = 1{digit in {0, 6, 8, 9}} (a closed loop) and
a2 = 1{digit >= 5}. User i's label is y^i = lambda^i a1 + (1 - lambda^i) a2, lambda^i evenly spaced in
[0.5 - delta_obj / 2, 0.5 + delta_obj / 2] (objective heterogeneity). Users also see different data (environment
heterogeneity, like FEMNIST's writers): user i draws a class c ~ p^i = (1 - skew) uniform + skew Dirichlet(conc), then
a uniform training image of class c, so the density ratio rho^i(item) = p^i(c) / (1/n) sum_j p^j(c) is exact.

Least squares per user: A(s) = phi phi^T, b^i(s) = phi y^i over a minibatch; the oracle central objective is
y^c = lambda-bar a1 + (1 - lambda-bar) a2 (§9 item 13). Every method runs vectorised over runs and users (arrays
(R, n, d)), one loop over steps; the metric is each user's test MSE under its own class mixture and label, evaluated
exactly from per-class test moments.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

LOOP = np.array([1.0, 0, 0, 0, 0, 0, 1, 0, 1, 1])  # a1: digits 0, 6, 8, 9
HIGH = (np.arange(10) >= 5).astype(float)  # a2: digits >= 5
DIGITS_METHODS = ("il", "fedavg", "affpcl", "affpcl_no_ic", "finetune", "pfedme", "ditto")


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


class DigitsUsers:
    """R runs of n users at one delta_obj: class mixtures p (R, n, 10), lambdas (n,), per-class labels y (R, n, 10),
    exact density ratios per class (R, n, 10) and test-MSE moments."""

    def __init__(self, feats: DigitFeatures, rng: np.random.Generator, runs: int, n: int, delta_obj: float,
                 skew: float = 0.5, concentration: float = 0.5):
        self.feats, self.runs, self.n, self.d = feats, runs, n, feats.d
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

    def sample(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _residual(phi: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minibatch least-squares direction mean_b phi_b (phi_b . w - y_b): phi (R, n, B, d), w (R, n, d) or (R, d)."""
    if w.ndim == 2:
        w = w[:, None]
    return np.einsum("rnbd,rnb->rnd", phi, np.einsum("rnbd,rnd->rnb", phi, w) - y) / phi.shape[2]


def run_digits(method: str, users: DigitsUsers, steps: int, alpha: float, batch: int, rng: np.random.Generator,
               eval_every: int = 10, reg: float = 0.15, pretrain_ratio: float = 0.5) -> np.ndarray:
    """Test MSE (E, R, n) of the model each user holds, after every `eval_every`-th step, for one of DIGITS_METHODS.

    AffPCL: oracle central objective, CDL (22-1), exact class density ratios (`affpcl_no_ic`: all ratios 1, the
    paper's FEMNIST setting); baselines as in Fig. 1 (spec §3.12), with personal models and a global model."""
    runs, n, d = users.runs, users.n, users.d
    x, xc = np.zeros((runs, n, d)), np.zeros((runs, d))
    switch = int(pretrain_ratio * steps)
    out = []
    for t in range(steps):
        cls, phi = users.sample(rng.uniform(size=(runs, n, batch, 2)))
        y = np.take_along_axis(users.y, cls, axis=-1)
        if method == "il" or (method == "finetune" and t >= switch):
            x = x - alpha * _residual(phi, x, y)
        elif method in ("fedavg", "finetune"):
            xc = xc - alpha * _residual(phi, xc, y).mean(1)
            x = np.broadcast_to(xc[:, None], x.shape)
        elif method in ("affpcl", "affpcl_no_ic"):
            corr = _residual(phi, xc, users.y_central[cls])  # g^{c->j}(x^c), batch mean
            if method == "affpcl":
                per = np.einsum("rnbd,rnb->rnbd", phi, np.einsum("rnbd,rd->rnb", phi, xc) - users.y_central[cls])
                by_class = np.einsum("rnbc,rnbd->rcd", np.eye(10)[cls], per) / batch  # sum_j mean_b per class
                server = np.einsum("ric,rcd->rid", users.rho, by_class) / n
            else:
                server = np.broadcast_to(corr.mean(1, keepdims=True), corr.shape)
            x = x - alpha * (_residual(phi, x, y) + server - corr)
            xc = xc - alpha * _residual(phi, xc, y).mean(1)
        elif method == "pfedme":
            x = x - alpha * (_residual(phi, x, y) + reg * (x - xc[:, None]))
            xc = x.mean(1)
        elif method == "ditto":
            xc = xc - alpha * _residual(phi, xc, y).mean(1)
            x = x - alpha * (_residual(phi, x, y) + reg * (x - xc[:, None]))
        else:
            raise ValueError(f"unknown method {method!r}")
        if (t + 1) % eval_every == 0:
            out.append(users.test_mse(x))
    return np.stack(out)
