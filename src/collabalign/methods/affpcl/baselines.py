"""The baselines of Fig. 1 (spec §3.1, §3.2, §3.12), vectorised over runs and agents; a loop over steps only.

Each returns the squared errors ||x^i_t - x^i_*||^2 of the model agent i uses, after each step: (T, R, n).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from collabalign.methods.affpcl.common import draw_noise, schedule, sq_err
from collabalign.methods.affpcl.systems import GaussianSystems


def run_il(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Independent learning: x^i <- x^i - a (A(s^i) x^i - b^i(s^i))."""
    return _local(system, draw_noise(system, steps, rng), schedule(alpha, steps, system.runs),
                  np.zeros((system.runs, system.n, system.d)))


def run_fedavg(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator
               ) -> np.ndarray:
    """FedAvg with one local step per round (= minibatch SGD, eq. 4): every agent uses the common x^c."""
    noise, a = draw_noise(system, steps, rng), schedule(alpha, steps, system.runs)
    return _fedavg(system, noise, a, np.zeros((system.runs, system.d)))[0]


def run_finetune(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator,
                 pretrain_ratio: float = 0.5) -> np.ndarray:
    """FedAvg for floor(ratio T) steps, then independent learning from the FedAvg model."""
    noise, a = draw_noise(system, steps, rng), schedule(alpha, steps, system.runs)
    k = int(pretrain_ratio * steps)
    err_fed, xc = _fedavg(system, noise[:k], a[:k], np.zeros((system.runs, system.d)))
    x = np.repeat(xc[:, None, :], system.n, axis=1)
    return np.concatenate([err_fed, _local(system, noise[k:], a[k:], x)])


def run_pfedme(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator,
               reg: float = 15.0) -> np.ndarray:
    """pFedMe (simplified, as in the reference scripts, §9 item 22): a proximal local step towards the global model,
    which is then the agents' average."""
    noise, a_all = draw_noise(system, steps, rng), schedule(alpha, steps, system.runs)
    x, xg = np.zeros((system.runs, system.n, system.d)), np.zeros((system.runs, system.d))
    err = np.empty((steps, system.runs, system.n))
    for t in range(steps):
        s, a = system.sample(noise[t]), a_all[t][:, None, None]
        x = x - a * (system.a_mul(s, x) - system.b(s) + reg * (x - xg[:, None]))
        xg = x.mean(1)
        err[t] = sq_err(x, system.xstar)
    return err


def run_ditto(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator,
              reg: float = 15.0) -> np.ndarray:
    """Ditto: a FedAvg step for the global w, then a regularised personal step towards the new w (same sample)."""
    noise, a_all = draw_noise(system, steps, rng), schedule(alpha, steps, system.runs)
    v, w = np.zeros((system.runs, system.n, system.d)), np.zeros((system.runs, system.d))
    err = np.empty((steps, system.runs, system.n))
    for t in range(steps):
        s, a = system.sample(noise[t]), a_all[t][:, None]
        b = system.b(s)
        w = w - a * (system.a_mul(s, w) - b).mean(1)
        v = v - a[..., None] * (system.a_mul(s, v) - b + reg * (v - w[:, None]))
        err[t] = sq_err(v, system.xstar)
    return err


def run_ifca(system: GaussianSystems, steps: int, alpha: float | np.ndarray, rng: np.random.Generator,
             clusters: int = 10, init_std: float = 1e-2, assign: Literal["exact", "sampled"] = "exact",
             window: int = 5) -> np.ndarray:
    """Clustered FL (IFCA, Ghosh et al. 2020). Each step every agent joins the cluster model with the smallest loss and
    each non-empty cluster takes a FedAvg step over its members. `exact` (oracle-assisted, the paper's setting) scores
    ||Abar^i w_k - bbar^i||^2; `sampled` scores ||A(s) w_k - b^i(s)||^2 averaged over the agent's last `window`
    samples, the argmin taken per agent over every cluster (the reference scripts' version always picked cluster 0)."""
    noise, a_all = draw_noise(system, steps, rng), schedule(alpha, steps, system.runs)
    runs, n, d = system.runs, system.n, system.d
    w = init_std * rng.standard_normal((runs, clusters, d))
    recent = np.empty((window, runs, n, d))
    err = np.empty((steps, runs, n))
    for t in range(steps):
        s, a = system.sample(noise[t]), a_all[t][:, None, None]
        recent[t % window] = s
        if assign == "exact":
            res = np.einsum("rnkl,rcl->rnck", system.abar, w) - system.bbar[:, :, None]
            loss = (res**2).sum(-1)
        else:
            loss = _sampled_loss(system, recent[: min(t + 1, window)], w)
        member = np.eye(clusters)[loss.argmin(-1)]  # one-hot (R, n, K)
        own = np.einsum("rnc,rcd->rnd", member, w)
        grad = system.a_mul(s, own) - system.b(s)
        counts = member.sum(1)[..., None]
        w = w - a * np.einsum("rnc,rnd->rcd", member, grad) / np.maximum(counts, 1.0)
        err[t] = sq_err(np.einsum("rnc,rcd->rnd", member, w), system.xstar)
    return err


def _sampled_loss(system: GaussianSystems, recent: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Mean over the stored samples of ||A(s) w_k - b^i(s)||^2 for every agent and cluster, (R, n, K)."""
    wins, runs, n, d = recent.shape
    k = w.shape[1]
    s = np.moveaxis(recent, 0, 2).reshape(runs, n * wins, d)  # agent-major: row i * wins + j
    s_k = np.repeat(s, k, axis=1)
    w_k = np.tile(w, (1, n * wins, 1))
    theta = np.repeat(system.theta, wins * k, axis=1)
    res = system.a_mul(s_k, w_k) - system.phi_mul(s_k, theta)
    return (res**2).sum(-1).reshape(runs, n, wins, k).mean(2)


def _local(system: GaussianSystems, noise: np.ndarray, a_all: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Independent SGD steps from x, (T, R, n) errors."""
    err = np.empty(noise.shape[:3])
    for t in range(noise.shape[0]):
        s = system.sample(noise[t])
        x = x - a_all[t][:, None, None] * (system.a_mul(s, x) - system.b(s))
        err[t] = sq_err(x, system.xstar)
    return err


def _fedavg(system: GaussianSystems, noise: np.ndarray, a_all: np.ndarray, xc: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
    """FedAvg steps from xc: (T, R, n) errors of the common model against each agent's x*, and the final xc."""
    err = np.empty(noise.shape[:3])
    for t in range(noise.shape[0]):
        s = system.sample(noise[t])
        xc = xc - a_all[t][:, None] * (system.a_mul(s, xc) - system.b(s)).mean(1)
        err[t] = sq_err(xc, system.xstar)
    return err, xc
