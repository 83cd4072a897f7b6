"""The small problem interface every AffPCL experiment implements (Gaussian systems, digits users, preference
annotators, tabular Markov reward processes and MDPs), vectorised over R independent runs and n agents.

Parameters are arrays (R, n, d) per agent or (R, d) for a common model. Per step every agent draws one sample (or a
minibatch), shared by every module of a method. AffPCL's notation (spec §2.6): g^i(x; s) is agent i's local
direction, g^{c->j}(x^c) = A(s^j) x^c - b^c_hat(s^j) the central direction at agent j's sample (the bias correction),
and (1/n) sum_j rho^i(s^j) g^{c->j}(x^c) its importance-corrected average for agent i.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Problem(Protocol):
    runs: int
    n: int
    d: int

    def draw(self, steps: int, rng: np.random.Generator) -> Any:
        """All randomness of one method's run, drawn up front (a per-agent reference loop can replay it)."""
        ...

    def sample(self, draws: Any, t: int, models: np.ndarray) -> Any:
        """Step t's samples; `models` (R, n, d) are the models the agents hold (a behaviour policy acts with them)."""
        ...

    def grad(self, x: np.ndarray, batch: Any) -> np.ndarray:
        """g^i(x; s^i_t) for every agent, (R, n, d); x is per agent (R, n, d) or common (R, d)."""
        ...

    def error(self, models: np.ndarray) -> np.ndarray:
        """The metric of the model each agent holds, (R, n)."""
        ...

    def central_start(self, central: str, weights: str) -> Any:
        """AffPCL's estimation state: the central objective b^c ("coe": learned, "oracle": given) and whatever the
        density ratios `weights` keep."""
        ...

    def bias_correction(self, xc: np.ndarray, est: Any, batch: Any) -> np.ndarray:
        """g^{c->i}(x^c) at each agent's own sample, (R, n, d)."""
        ...

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: Any, batch: Any, x: np.ndarray,
                             weights: str) -> np.ndarray:
        """(1/n) sum_j rho^i(s^j) g^{c->j}(x^c) for every agent i, (R, n, d), with the problem's density ratios
        `weights` (exact or an estimate; may use the personal models x); `corr` is bias_correction's output."""
        ...

    def coe(self, est: Any, batch: Any, a: np.ndarray) -> Any:
        """The estimation state after this step (COE from time-t values; step sizes a (R,))."""
        ...


def sq_err(x: np.ndarray, xstar: np.ndarray) -> np.ndarray:
    """Squared error per run and agent, (R, n); a central x of shape (R, d) is compared with every agent's x*."""
    if x.ndim == 2:
        x = x[:, None, :]
    return ((x - xstar) ** 2).sum(-1)
