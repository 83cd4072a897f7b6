"""Personalised reward models from preference data with AffPCL (spec §8.3), vectorised over runs and annotators.

An item is a pair s = (x, y_a, y_b) with frozen features z = phi(x, y_a) - phi(x, y_b) in R^d and K measurable
attribute margins a(s) = attr(x, y_a) - attr(x, y_b). Annotator i of run r scalarises the attributes with weights
lambda^i = lambda-bar + delta u_i (u_i uniform on the unit sphere): margin m^i(s) = scale a(s)^T lambda^i, and labels
l ~ Bernoulli(sigmoid(m^i(s))) (Bradley-Terry). Every annotator draws items from the same training pool (mu^i = mu:
no item shift), so environment heterogeneity lives only in the label law. The reward model is linear, r^i = z^T w^i.

Three mappings onto the AffPCL system (the spec's pitfall: label noise must sit in the shared observation):
  r1  multi-attribute scalarised regression: target y^i(s) = m^i(s) (observed attributes), A = z z^T, b^i = z y^i;
      the central objective y^c(s) = a(s)^T theta^c is learned by COE on the attributes (or the oracle scale
      lambda-bar); rho = 1 (shared item pool).
  r2  label inside the observation, BT / logistic loss: s-hat = (s, l), g(w; s-hat) = (sigmoid(z^T w) - l) z;
      one direction for every annotator; the importance weights rho^i(s, l) = P_i(l|s) / (1/n) sum_k P_k(l|s)
      correct the label law, from the current models ("plugin", bounded by n), the true BT laws ("exact") or 1.
  r3  the least-squares variant of r2: g(w; s-hat) = z (z^T w - (2 l - 1)); plug-in P_w(l=1|s) = clip((1 +
      z^T w) / 2).
`RewardTask` is one mapping as an AffPCL problem (problem.py). The metric is each annotator's expected held-out
preference accuracy under its own BT labels: the mean over test items of P_i(l = 1{z^T w > 0} | s) (ties count 1/2),
so no label sampling noise enters the evaluation.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import expit

from collabalign.data.annotator_pools import Pool

VARIANTS = ("r1", "r2", "r3")
PLUGIN_CLIP = 0.05  # r3's linear-probability plug-in is clipped to [0.05, 0.95]


class Preferences(NamedTuple):
    """One step's minibatches: features z (R, n, B, d), attribute margins a (R, n, B, K), labels, margins (the targets
    of r1) and every annotator's BT probability of every sample p_all (R, n_i, n_j, B) (exact weights)."""

    z: np.ndarray
    a: np.ndarray
    label: np.ndarray
    margin: np.ndarray
    p_all: np.ndarray


class Annotators:
    """R runs of n annotators on one pool: per-run train/test split, weights lambda (R, n, K), margins and BT
    probabilities on every item (R, n, N)."""

    def __init__(self, pool: Pool, rng: np.random.Generator, runs: int, n: int, delta: float,
                 lam_bar: np.ndarray, scale: float, test_share: float = 0.3):
        self.pool, self.runs, self.n, self.d = pool, runs, n, pool.z.shape[1]
        items, k = pool.attrs.shape
        perm = np.argsort(rng.uniform(size=(runs, items)), axis=1)
        n_test = int(test_share * items)
        self.test_idx, self.train_idx = perm[:, :n_test], perm[:, n_test:]
        u = rng.standard_normal((runs, n, k))
        u /= np.linalg.norm(u, axis=-1, keepdims=True)
        self.lam_bar, self.scale = np.asarray(lam_bar, dtype=float), scale
        self.lam = self.lam_bar + delta * u
        self.margin = scale * np.einsum("mk,rik->rim", pool.attrs, self.lam)
        self.prob = expit(self.margin)
        self.bayes_accuracy = self._gather(np.maximum(self.prob, 1 - self.prob), self.test_idx).mean(-1)

    def _gather(self, per_item: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """per_item (R, n, N) at per-run item indices idx (R, M) -> (R, n, M)."""
        return np.take_along_axis(per_item, np.broadcast_to(idx[:, None], (self.runs, self.n, idx.shape[1])), -1)

    def sample(self, pos: np.ndarray, u: np.ndarray) -> Preferences:
        """One step's minibatches from item positions and label uniforms (R, n, B)."""
        runs, n, b = pos.shape
        items = np.take_along_axis(self.train_idx, pos.reshape(runs, n * b), axis=1).reshape(runs, n, b)
        flat = items.reshape(runs, 1, n * b)
        p_all = np.take_along_axis(self.prob, np.broadcast_to(flat, (runs, n, n * b)), -1).reshape(runs, n, n, b)
        p_own = np.einsum("rjjb->rjb", p_all)
        m_all = np.take_along_axis(self.margin, np.broadcast_to(flat, (runs, n, n * b)), -1).reshape(runs, n, n, b)
        return Preferences(self.pool.z[items], self.pool.attrs[items], (u < p_own).astype(float),
                           np.einsum("rjjb->rjb", m_all), p_all)

    def accuracy(self, w: np.ndarray) -> np.ndarray:
        """Expected held-out preference accuracy of each annotator's model under its BT labels, (R, n); w is
        (R, n, d) or a common (R, d)."""
        if w.ndim == 2:
            w = w[:, None]
        z_test = self.pool.z[self.test_idx]  # (R, M, d)
        pred = np.einsum("rmd,rid->rim", z_test, np.broadcast_to(w, (self.runs, self.n, self.d)))
        p = self._gather(self.prob, self.test_idx)
        correct = np.where(pred > 0, p, np.where(pred < 0, 1 - p, 0.5))
        return correct.mean(-1)

    def optimum(self, variant: str, ridge: float = 1e-6) -> np.ndarray | None:
        """Each annotator's population optimum w^i_* on its item law (the run's training pool), (R, n, d): least
        squares for r1 (target m^i) and r3 (target E[2l - 1 | s] = 2 P_i - 1); for r2 the BT generating direction
        scale * w_attr lambda^i when the attributes are exactly linear in z, else None."""
        if variant == "r2":
            return None if self.pool.w_attr is None else self.scale * np.einsum("dk,rik->rid", self.pool.w_attr,
                                                                                  self.lam)
        z = self.pool.z[self.train_idx]  # (R, M, d)
        target = self._gather(self.margin if variant == "r1" else 2 * self.prob - 1, self.train_idx)
        cov = np.einsum("rmd,rme->rde", z, z) / z.shape[1] + ridge * np.eye(self.d)
        lin = np.einsum("rmd,rim->rid", z, target) / z.shape[1]
        return np.linalg.solve(cov[:, None], lin[..., None])[..., 0]


class RewardCentral(NamedTuple):
    theta: np.ndarray  # r1's central attribute weights theta^c (R, K)
    learn: bool  # False: theta^c given (oracle: scale * lambda-bar)
    v: np.ndarray | None  # "plugin_il": independently learned models whose label laws give the density ratios


class RewardTask:
    """Reward-model learning from one variant's mapping (r1, r2, r3) as an AffPCL problem (problem.py): minibatches
    of `batch` items per annotator and step, ridge penalty `ridge`, COE step `coe_alpha` on r1's attributes."""

    def __init__(self, users: Annotators, variant: str, batch: int = 1, ridge: float = 0.0, coe_alpha: float = 0.05):
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}")
        self.users, self.variant, self.batch, self.ridge, self.coe_alpha = users, variant, batch, ridge, coe_alpha
        self.runs, self.n, self.d = users.runs, users.n, users.d

    def residual(self, w: np.ndarray, s: Preferences) -> np.ndarray:
        """Per-sample scalar residual e with g(w; s) = e z, (R, n, B); w is (R, n, d) or a common (R, d)."""
        if w.ndim == 2:
            w = w[:, None]
        pred = np.einsum("rnbd,rnd->rnb", s.z, w)
        if self.variant == "r1":
            return pred - s.margin
        if self.variant == "r2":
            return expit(pred) - s.label
        return pred - (2 * s.label - 1)

    def label_prob(self, w: np.ndarray, z: np.ndarray, label: np.ndarray) -> np.ndarray:
        """P_{w^i}(l_jb | s_jb) for every annotator's model i on every sample (j, b): w (R, n, d), z (R, n, B, d) ->
        (R, n_i, n_j, B); logistic for r2, clipped linear probability for r3."""
        pred = np.einsum("rid,rjbd->rijb", w, z)
        p1 = expit(pred) if self.variant == "r2" else np.clip((1 + pred) / 2, PLUGIN_CLIP, 1 - PLUGIN_CLIP)
        return np.where(label[:, None] > 0.5, p1, 1 - p1)

    # the problem interface (problem.py)

    def draw(self, steps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """All randomness of a run up front: item positions in the training pool (T, R, n, B) and uniforms for the
        labels (T, R, n, B), so several methods and a per-annotator reference loop can replay them."""
        pos = rng.integers(self.users.train_idx.shape[1], size=(steps, self.runs, self.n, self.batch))
        return pos, rng.uniform(size=(steps, self.runs, self.n, self.batch))

    def sample(self, draws: tuple[np.ndarray, np.ndarray], t: int, models: np.ndarray) -> Preferences:
        return self.users.sample(draws[0][t], draws[1][t])

    def grad(self, x: np.ndarray, batch: Preferences) -> np.ndarray:
        """Minibatch-mean local direction g(w) + ridge w per annotator, (R, n, d)."""
        g = np.einsum("rnb,rnbd->rnd", self.residual(x, batch), batch.z) / batch.z.shape[2]
        return g + self.ridge * (x if x.ndim == 3 else x[:, None])

    def error(self, models: np.ndarray) -> np.ndarray:
        return self.users.accuracy(models)

    def central_start(self, central: str, weights: str) -> RewardCentral:
        k = self.users.lam_bar.size
        theta = (self.users.scale * np.broadcast_to(self.users.lam_bar, (self.runs, k))).copy() \
            if central == "oracle" else np.zeros((self.runs, k))
        v = np.zeros((self.runs, self.n, self.d)) if weights == "plugin_il" else None
        return RewardCentral(theta, central == "coe", v)

    def bias_correction(self, xc: np.ndarray, est: RewardCentral, batch: Preferences) -> np.ndarray:
        """The central model's direction at each sample: under r1's COE target a(s)^T theta^c, or (r2, r3) the
        shared label-inside observation, where it is x^c's own direction."""
        z, b = batch.z, batch.z.shape[2]
        e_c = self._central_residual(xc, est, batch)
        return np.einsum("rnb,rnbd->rnd", e_c, z) / b + self.ridge * xc[:, None]

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: RewardCentral, batch: Preferences,
                             x: np.ndarray, weights: str) -> np.ndarray:
        """r1: rho = 1 (one item pool, labels outside the observation). r2 / r3: rho^i(s, l) = P_i(l|s) / mean_k
        P_k(l|s) from the true BT laws ("exact"), the personal models ("plugin") or independently learned models
        ("plugin_il")."""
        if self.variant == "r1":
            return np.broadcast_to(corr.mean(1, keepdims=True), corr.shape)
        z, label = batch.z, batch.label
        runs, n, b, d = z.shape
        if weights == "exact":
            p = np.where(label[:, None] > 0.5, batch.p_all, 1 - batch.p_all)
        elif weights in ("plugin", "plugin_il"):
            p = self.label_prob(x if weights == "plugin" else est.v, z, label)
        else:
            raise ValueError(f"reward task: unknown density ratios {weights!r}")
        rho = plugin_ratio(p)
        weighted = (rho * self._central_residual(xc, est, batch)[:, None]).reshape(runs, n, n * b)
        return weighted @ z.reshape(runs, n * b, d) / (n * b) + self.ridge * xc[:, None]

    def coe(self, est: RewardCentral, batch: Preferences, a: np.ndarray) -> RewardCentral:
        """r1's COE step on the attributes (step coe_alpha), and the independent models of "plugin_il"."""
        theta, v = est.theta, est.v
        if self.variant == "r1" and est.learn:
            n, b = batch.a.shape[1:3]
            target_c = np.einsum("rnbk,rk->rnb", batch.a, theta)
            theta = theta - self.coe_alpha * np.einsum("rnb,rnbk->rk", target_c - batch.margin, batch.a) / (n * b)
        if v is not None:
            v = v - a[:, None, None] * self.grad(v, batch)
        return RewardCentral(theta, est.learn, v)

    def _central_residual(self, xc: np.ndarray, est: RewardCentral, batch: Preferences) -> np.ndarray:
        """The central model's per-sample residual, (R, n, B)."""
        if self.variant != "r1":
            return self.residual(xc, batch)
        return np.einsum("rnbd,rd->rnb", batch.z, xc) - np.einsum("rnbk,rk->rnb", batch.a, est.theta)


def plugin_ratio(p: np.ndarray) -> np.ndarray:
    """rho^i(s_jb) = p_i / (1/n) sum_k p_k from P_k(l_jb | s_jb) (R, n_k, n_j, B): in (0, n], and 1 when every
    annotator's law agrees."""
    return p / p.mean(1, keepdims=True)
