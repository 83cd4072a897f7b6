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
Methods: il (per annotator), fedavg (one pooled model), affpcl, finetune (pooled for half the steps, then per
annotator), ditto (FedAvg global step, then a proximal personal step on the same sample). The metric is each
annotator's expected held-out preference accuracy under its own BT labels: the mean over test items of
P_i(l = 1{z^T w > 0} | s) (ties count 1/2), so no label sampling noise enters the evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import expit

VARIANTS = ("r1", "r2", "r3")
REWARD_METHODS = ("il", "fedavg", "affpcl", "finetune", "ditto")
Weights = Literal["plugin", "plugin_il", "exact", "none"]
PLUGIN_CLIP = 0.05  # r3's linear-probability plug-in is clipped to [0.05, 0.95]


@dataclass
class Pool:
    """Items: features z (N, d), attribute margins (N, K); `w_attr` (d, K) when attrs = z @ w_attr exactly."""

    z: np.ndarray
    attrs: np.ndarray
    names: tuple[str, ...]
    w_attr: np.ndarray | None = None


def synthetic_pool(rng: np.random.Generator, items: int, d: int, k: int) -> Pool:
    """Gaussian items z ~ N(0, I/d), scaled to max norm 1, and K attributes exactly linear in z with unit variance
    (attrs = z_raw Q sqrt(d), Q orthonormal d x K), so BT's generating reward direction is known (spec §8.3 R3)."""
    z_raw = rng.standard_normal((items, d)) / np.sqrt(d)
    top = np.linalg.norm(z_raw, axis=1).max()
    q = np.linalg.qr(rng.standard_normal((d, k)))[0]
    w_attr = q * np.sqrt(d) * top
    z = z_raw / top
    return Pool(z, z @ w_attr, tuple(f"a{j}" for j in range(k)), w_attr)


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

    def draw(self, steps: int, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """All randomness of a run up front: item positions in the training pool (T, R, n, B) and uniforms for the
        labels (T, R, n, B), so a per-annotator reference loop can replay them."""
        pos = rng.integers(self.train_idx.shape[1], size=(steps, self.runs, self.n, batch))
        return pos, rng.uniform(size=(steps, self.runs, self.n, batch))

    def sample(self, pos: np.ndarray, u: np.ndarray) -> dict[str, np.ndarray]:
        """One step's minibatches: items (R, n, B), features (R, n, B, d), attributes (R, n, B, K), labels, margins
        (targets of r1) and every annotator's BT probability of every sample (R, n_i, n_j, B) (exact weights)."""
        runs, n, b = pos.shape
        items = np.take_along_axis(self.train_idx, pos.reshape(runs, n * b), axis=1).reshape(runs, n, b)
        flat = items.reshape(runs, 1, n * b)
        p_all = np.take_along_axis(self.prob, np.broadcast_to(flat, (runs, n, n * b)), -1).reshape(runs, n, n, b)
        p_own = np.einsum("rjjb->rjb", p_all)
        m_all = np.take_along_axis(self.margin, np.broadcast_to(flat, (runs, n, n * b)), -1).reshape(runs, n, n, b)
        return {"items": items, "z": self.pool.z[items], "a": self.pool.attrs[items],
                "label": (u < p_own).astype(float), "margin": np.einsum("rjjb->rjb", m_all), "p_all": p_all}

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


def residual(variant: str, z: np.ndarray, w: np.ndarray, s: dict[str, np.ndarray]) -> np.ndarray:
    """Per-sample scalar residual e with g(w; s) = e z, (R, n, B); w is (R, n, d) or a common (R, d)."""
    if w.ndim == 2:
        w = w[:, None]
    pred = np.einsum("rnbd,rnd->rnb", z, w)
    if variant == "r1":
        return pred - s["margin"]
    if variant == "r2":
        return expit(pred) - s["label"]
    return pred - (2 * s["label"] - 1)


def direction(variant: str, w: np.ndarray, s: dict[str, np.ndarray], ridge: float) -> np.ndarray:
    """Minibatch-mean local direction g(w) + ridge w per annotator, (R, n, d)."""
    g = np.einsum("rnb,rnbd->rnd", residual(variant, s["z"], w, s), s["z"]) / s["z"].shape[2]
    return g + ridge * (w if w.ndim == 3 else w[:, None])


def label_prob(variant: str, w: np.ndarray, z: np.ndarray, label: np.ndarray) -> np.ndarray:
    """P_{w^i}(l_jb | s_jb) for every annotator's model i on every sample (j, b): w (R, n, d), z (R, n, B, d) ->
    (R, n_i, n_j, B); logistic for r2, clipped linear probability for r3."""
    pred = np.einsum("rid,rjbd->rijb", w, z)
    p1 = expit(pred) if variant == "r2" else np.clip((1 + pred) / 2, PLUGIN_CLIP, 1 - PLUGIN_CLIP)
    return np.where(label[:, None] > 0.5, p1, 1 - p1)


def plugin_ratio(p: np.ndarray) -> np.ndarray:
    """rho^i(s_jb) = p_i / (1/n) sum_k p_k from P_k(l_jb | s_jb) (R, n_k, n_j, B): in (0, n], and 1 when every
    annotator's law agrees."""
    return p / p.mean(1, keepdims=True)


def run_reward(method: str, variant: str, users: Annotators, steps: int, alpha: float, batch: int,
               rng: np.random.Generator, eval_every: int = 10, reg: float = 0.15, ridge: float = 0.0,
               weights: Weights = "exact", central: Literal["coe", "oracle"] = "coe", coe_alpha: float = 0.05,
               pretrain_ratio: float = 0.5, draws: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Held-out accuracies (E, R, n) after every eval_every-th step and the final models (R, n, d) of one method.

    AffPCL (spec §3.8 with CDL (22-1)): x^i <- x^i - alpha (g(x^i; s_i) + (1/n) sum_j rho^i(s_j) g^{c->j}(x^c)
    - g^{c->i}(x^c)), where g^{c->j}(x^c) is the central model's direction on s_j under the central objective: r1's
    COE target a(s)^T theta^c (rho = 1), r2/r3's shared label-inside observation (rho from `weights`)."""
    runs, n, d = users.runs, users.n, users.d
    pos_all, u_all = draws if draws is not None else users.draw(steps, batch, rng)
    x, xc, v = np.zeros((runs, n, d)), np.zeros((runs, d)), np.zeros((runs, n, d))
    theta = (users.scale * np.broadcast_to(users.lam_bar, (runs, users.lam_bar.size))).copy() \
        if central == "oracle" else np.zeros((runs, users.lam_bar.size))
    switch = int(pretrain_ratio * steps)
    out = []
    for t in range(steps):
        s = users.sample(pos_all[t], u_all[t])
        if method == "il" or (method == "finetune" and t >= switch):
            if method == "finetune" and t == switch:
                x = np.repeat(xc[:, None], n, axis=1)
            x = x - alpha * direction(variant, x, s, ridge)
        elif method in ("fedavg", "finetune"):
            xc = xc - alpha * direction(variant, xc, s, ridge).mean(1)
            x = np.broadcast_to(xc[:, None], x.shape)
        elif method == "affpcl":
            dre = v if weights == "plugin_il" else x
            x, xc, theta = _affpcl_step(variant, x, xc, theta, s, alpha, ridge, weights, central, coe_alpha, dre)
            if weights == "plugin_il":
                v = v - alpha * direction(variant, v, s, ridge)
        elif method == "ditto":
            xc = xc - alpha * direction(variant, xc, s, ridge).mean(1)
            x = x - alpha * (direction(variant, x, s, ridge) + reg * (x - xc[:, None]))
        else:
            raise ValueError(f"unknown method {method!r}")
        if (t + 1) % eval_every == 0:
            out.append(users.accuracy(x))
    return np.stack(out), np.array(x)


def _affpcl_step(variant: str, x: np.ndarray, xc: np.ndarray, theta: np.ndarray, s: dict[str, np.ndarray],
                 alpha: float, ridge: float, weights: Weights, central: str, coe_alpha: float,
                 dre: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One simultaneous AffPCL step from time-t values: personal models, CDL (22-1) and (r1) COE."""
    z = s["z"]
    runs, n, b, d = z.shape
    if variant == "r1":
        target_c = np.einsum("rnbk,rk->rnb", s["a"], theta)  # COE's central objective y^c(s)
        e_c = np.einsum("rnbd,rd->rnb", z, xc) - target_c
        corr = np.einsum("rnb,rnbd->rnd", e_c, z) / b + ridge * xc[:, None]
        server = np.broadcast_to(corr.mean(1, keepdims=True), corr.shape)  # rho = 1: shared item pool
        if central == "coe":
            theta = theta - coe_alpha * np.einsum("rnb,rnbk->rk", target_c - s["margin"], s["a"]) / (n * b)
    else:
        e_c = residual(variant, z, xc, s)
        corr = np.einsum("rnb,rnbd->rnd", e_c, z) / b + ridge * xc[:, None]
        if weights == "none":
            rho = np.ones((runs, n, n, b))
        else:
            p = s["p_all"] if weights == "exact" else label_prob(variant, dre, z, s["label"])
            p = np.where(s["label"][:, None] > 0.5, p, 1 - p) if weights == "exact" else p
            rho = plugin_ratio(p)
        weighted = (rho * e_c[:, None]).reshape(runs, n, n * b)
        server = weighted @ z.reshape(runs, n * b, d) / (n * b) + ridge * xc[:, None]
    x_new = x - alpha * (direction(variant, x, s, ridge) + server - corr)
    central = direction(variant, xc, s, ridge) if variant == "r1" else corr  # r2/r3: corr is xc's own direction
    xc_new = xc - alpha * central.mean(1)
    return x_new, xc_new, theta
