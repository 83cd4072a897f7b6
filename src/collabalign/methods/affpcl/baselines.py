"""The baselines of the AffPCL experiments (spec §3.1, §3.2, §3.12), each written once over the problem interface
(problem.py) and run by `algorithm.run`: one step of every agent per round, all variables starting at zero."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from collabalign.methods.affpcl.problem import Problem


def _common(problem: Problem, x: np.ndarray) -> np.ndarray:
    """A common model (R, d) as every agent's model (R, n, d), without copying."""
    return np.broadcast_to(x[:, None], (problem.runs, problem.n, problem.d))


def _fedavg_step(problem: Problem, xc: np.ndarray, batch: Any, a: np.ndarray) -> np.ndarray:
    """One FedAvg round with one local step: x^c <- x^c - a (1/n) sum_i g^i(x^c) (minibatch SGD, eq. 4)."""
    return xc - a[:, None] * problem.grad(xc, batch).mean(1)


@dataclass(frozen=True)
class IL:
    """Independent learning: x^i <- x^i - a g^i(x^i)."""

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> np.ndarray:
        return np.zeros((problem.runs, problem.n, problem.d))

    def step(self, problem: Problem, x: np.ndarray, batch: Any, a: np.ndarray, t: int) -> np.ndarray:
        return x - a[:, None, None] * problem.grad(x, batch)

    def held(self, problem: Problem, x: np.ndarray) -> np.ndarray:
        return x


@dataclass(frozen=True)
class OneStepFedAvg:
    """FedAvg with one local step per round over the problem interface (reported as "FedAvg"; the federation
    engine's FedAvg is `methods.fedavg.FedAvg`): every agent uses the common x^c."""

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> np.ndarray:
        return np.zeros((problem.runs, problem.d))

    def step(self, problem: Problem, xc: np.ndarray, batch: Any, a: np.ndarray, t: int) -> np.ndarray:
        return _fedavg_step(problem, xc, batch, a)

    def held(self, problem: Problem, xc: np.ndarray) -> np.ndarray:
        return _common(problem, xc)


@dataclass(frozen=True)
class FineTune:
    """FedAvg for the first floor(ratio T) steps, then independent learning from the FedAvg model."""

    pretrain_ratio: float = 0.5

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> tuple:
        return np.zeros((problem.runs, problem.d)), None, int(self.pretrain_ratio * steps)

    def step(self, problem: Problem, state: tuple, batch: Any, a: np.ndarray, t: int) -> tuple:
        xc, x, switch = state
        if t < switch:
            return _fedavg_step(problem, xc, batch, a), None, switch
        if x is None:
            x = np.repeat(xc[:, None], problem.n, axis=1)
        return xc, x - a[:, None, None] * problem.grad(x, batch), switch

    def held(self, problem: Problem, state: tuple) -> np.ndarray:
        xc, x, _ = state
        return _common(problem, xc) if x is None else x


@dataclass(frozen=True)
class PFedMe:
    """pFedMe, simplified as in the reference scripts (§9 item 22): a proximal local step towards the global model,
    which is then the agents' average."""

    reg: float = 15.0

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((problem.runs, problem.n, problem.d)), np.zeros((problem.runs, problem.d))

    def step(self, problem: Problem, state: tuple, batch: Any, a: np.ndarray, t: int) -> tuple:
        x, xg = state
        x = x - a[:, None, None] * (problem.grad(x, batch) + self.reg * (x - xg[:, None]))
        return x, x.mean(1)

    def held(self, problem: Problem, state: tuple) -> np.ndarray:
        return state[0]


@dataclass(frozen=True)
class Ditto:
    """Ditto: a FedAvg step for the global w, then a regularised personal step towards the new w (same sample)."""

    reg: float = 15.0

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((problem.runs, problem.n, problem.d)), np.zeros((problem.runs, problem.d))

    def step(self, problem: Problem, state: tuple, batch: Any, a: np.ndarray, t: int) -> tuple:
        v, w = state
        w = _fedavg_step(problem, w, batch, a)
        return v - a[:, None, None] * (problem.grad(v, batch) + self.reg * (v - w[:, None])), w

    def held(self, problem: Problem, state: tuple) -> np.ndarray:
        return state[0]


@dataclass(frozen=True)
class IFCA:
    """Clustered FL (IFCA, Ghosh et al. 2020): each step every agent joins the cluster model with the smallest loss
    (the problem's `cluster_loss`: exact, oracle-assisted as in the paper, or from the agent's last `window` samples)
    and each non-empty cluster takes a FedAvg step over its members. Cluster models start at init_std N(0, I)."""

    clusters: int = 10
    init_std: float = 1e-2
    assign: Literal["exact", "sampled"] = "exact"
    window: int = 5

    def start(self, problem: Problem, steps: int, rng: np.random.Generator) -> tuple:
        w = self.init_std * rng.standard_normal((problem.runs, self.clusters, problem.d))
        member = np.zeros((problem.runs, problem.n, self.clusters))
        member[..., 0] = 1.0  # before the first assignment every agent holds cluster 0's model
        return w, member, ()

    def step(self, problem: Problem, state: tuple, batch: Any, a: np.ndarray, t: int) -> tuple:
        w, _, recent = state
        recent = (*recent, batch)[-self.window:]
        loss = problem.cluster_loss(w, recent if self.assign == "sampled" else None)
        member = np.eye(self.clusters)[loss.argmin(-1)]  # one-hot (R, n, K)
        grad = problem.grad(np.einsum("rnc,rcd->rnd", member, w), batch)
        counts = member.sum(1)[..., None]
        w = w - a[:, None, None] * np.einsum("rnc,rnd->rcd", member, grad) / np.maximum(counts, 1.0)
        return w, member, recent

    def held(self, problem: Problem, state: tuple) -> np.ndarray:
        w, member, _ = state
        return np.einsum("rnc,rcd->rnd", member, w)
