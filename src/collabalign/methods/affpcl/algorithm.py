"""AffPCL (Algorithm 1 with the eq. 8 fixes of spec §9 items 1-2): one update rule over the problem interface
(problem.py), and the driver that runs it or any baseline, vectorised over runs and agents; a loop over steps only.

Per step every agent draws one sample, shared by all modules; all modules update simultaneously from time-t values:
  x^i  <- x^i  - a * (g^i(x^i) + (1/n) sum_j rho^i(s^j) g^{c->j}(x^c) - g^{c->i}(x^c))
  x^c  <- x^c  - a * (1/n) sum_i g^i(x^c)  (CDL 22-1)  or  (1/n) sum_i g^{c->i}(x^c)  (CDL 22-2)
and the problem's COE step on the central objective b^c (or b^c given: "oracle").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np

from collabalign.methods.affpcl.problem import Problem

Central = Literal["coe", "oracle"]
Cdl = Literal["22-1", "22-2"]


class Method(Protocol):
    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> Any:
        """The method's initial state (every variable at zero unless the method says otherwise)."""
        ...

    def step(self, problem: Problem, state: Any, batch: Any, a: np.ndarray, t: int) -> Any:
        """The state after step t, with step sizes a (R,)."""
        ...

    def held(self, problem: Problem, state: Any) -> np.ndarray:
        """The model each agent uses, (R, n, d) (a common model broadcast over the agents)."""
        ...


class AffPCLState(NamedTuple):
    x: np.ndarray  # personal models (R, n, d)
    xc: np.ndarray  # central decision (R, d)
    est: Any  # the problem's COE / density-ratio state


@dataclass(frozen=True)
class AffPCL:
    """AffPCL with the central objective learned by COE ("coe") or given ("oracle"), CDL (22-1) or (22-2), and the
    problem's density ratios `weights` ("none": all ratios 1, no importance correction)."""

    central: Central = "coe"
    cdl: Cdl = "22-1"
    weights: str = "exact"

    def start(self, problem: Problem, steps: int, rng: np.random.Generator | None) -> AffPCLState:
        return AffPCLState(np.zeros((problem.runs, problem.n, problem.d)), np.zeros((problem.runs, problem.d)),
                           problem.central_start(self.central, self.weights))

    def step(self, problem: Problem, state: AffPCLState, batch: Any, a: np.ndarray, t: int) -> AffPCLState:
        x, xc, est = state
        corr = problem.bias_correction(xc, est, batch)
        if self.weights == "none":
            server = np.broadcast_to(corr.mean(1, keepdims=True), corr.shape)
        else:
            server = problem.importance_corrected(corr, xc, est, batch, x, self.weights)
        x_new = x - a[:, None, None] * (problem.grad(x, batch) + server - corr)
        central = problem.grad(xc, batch) if self.cdl == "22-1" else corr
        return AffPCLState(x_new, xc - a[:, None] * central.mean(1), problem.coe(est, batch, a))

    def held(self, problem: Problem, state: AffPCLState) -> np.ndarray:
        return state.x


def schedule(alpha: float | np.ndarray, steps: int, runs: int) -> np.ndarray:
    """Step sizes as a (T, R) array from a constant, a per-step (T,) array, a per-run (R,) array or a (T, R) array."""
    a = np.asarray(alpha, dtype=float)
    if a.ndim == 1 and a.size == runs and a.size != steps:
        a = a[None, :]
    elif a.ndim == 1:
        a = a[:, None]
    return np.broadcast_to(a, (steps, runs))


def run(method: Method, problem: Problem, steps: int, alpha: float | np.ndarray, rng: np.random.Generator | None,
        draws: Any = None, every: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The problem's error (E, R, n) of the models the agents hold after every `every`-th step, and the final models
    (R, n, d). The run's randomness comes from `rng` (the problem's draws first, then the method's own), or from
    `draws` shared by several methods (common random numbers)."""
    draws = problem.draw(steps, rng) if draws is None else draws
    a_all = schedule(alpha, steps, problem.runs)
    state = method.start(problem, steps, rng)
    held = method.held(problem, state)
    out = []
    for t in range(steps):
        state = method.step(problem, state, problem.sample(draws, t, held), a_all[t], t)
        held = method.held(problem, state)
        if (t + 1) % every == 0:
            out.append(problem.error(held))
    return np.stack(out), held
