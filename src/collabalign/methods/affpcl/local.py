"""FedAvg and AffPCL with several local steps between communication rounds, the setting of the paper's FEMNIST
experiment ("70 samples between two communication rounds", spec §4, §9 item 13), over the problem interface
(problem.py) and run by `algorithm.run`. A round is `local` consecutive steps; every step each agent draws a fresh
minibatch; the server acts only at a round's first step (AffPCL's frozen direction) and last step (averaging)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from collabalign.methods.affpcl.problem import Problem


def _local_sgd(problem: Problem, xc: np.ndarray, copies: np.ndarray, batch: Any, a: np.ndarray, t: int,
               local: int) -> tuple[np.ndarray, np.ndarray]:
    """One local SGD step of every agent's copy of the server model (R, n, d); the server model (R, d) becomes the
    copies' average, and every copy restarts from it, at the end of a round."""
    copies = copies - a[:, None, None] * problem.grad(copies, batch)
    if (t + 1) % local:
        return xc, copies
    xc = copies.mean(1)
    return xc, np.broadcast_to(xc[:, None], copies.shape)


@dataclass(frozen=True)
class LocalFedAvg:
    """FedAvg with `local` local SGD steps per round; every agent uses the server model."""

    local: int = 70

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((problem.runs, problem.d)), np.zeros((problem.runs, problem.n, problem.d))

    def step(self, problem: Problem, state: tuple, batch: Any, a: np.ndarray, t: int) -> tuple:
        return _local_sgd(problem, *state, batch, a, t, self.local)

    def held(self, problem: Problem, state: tuple) -> np.ndarray:
        return np.broadcast_to(state[0][:, None], (problem.runs, problem.n, problem.d))


class LocalAffPCLState(NamedTuple):
    x: np.ndarray  # personal models (R, n, d)
    xc: np.ndarray  # the server's central decision, fixed within a round (R, d)
    copies: np.ndarray  # the agents' local CDL iterates (R, n, d)
    server: np.ndarray  # the round's frozen (1/n) sum_j g^{c->j}(x^c) (R, 1, d)
    est: Any  # the problem's central-objective state (the oracle b^c)


@dataclass(frozen=True)
class LocalAffPCL:
    """AffPCL with `local` local steps per round, the oracle central objective and no importance correction (the
    paper's FEMNIST setting; spec §9 item 13): at a round's first step the server averages g^{c->j}(x^c) over the
    agents' minibatches and freezes it; every step agent i moves x^i along g^i(x^i) + that average - g^{c->i}(x^c)
    on its own fresh minibatch at the round's x^c, and CDL (22-1) runs as FedAvg's local SGD on the agents' copies."""

    local: int = 70

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> LocalAffPCLState:
        zeros = np.zeros((problem.runs, problem.n, problem.d))
        return LocalAffPCLState(zeros, zeros[:, 0], zeros, zeros[:, :1], problem.central_start("oracle", "none"))

    def step(self, problem: Problem, state: LocalAffPCLState, batch: Any, a: np.ndarray, t: int) -> LocalAffPCLState:
        x, xc, copies, server, est = state
        corr = problem.bias_correction(xc, est, batch)
        if t % self.local == 0:
            server = corr.mean(1, keepdims=True)
        x = x - a[:, None, None] * (problem.grad(x, batch) + server - corr)
        return LocalAffPCLState(x, *_local_sgd(problem, xc, copies, batch, a, t, self.local), server, est)

    def held(self, problem: Problem, state: LocalAffPCLState) -> np.ndarray:
        return state.x
