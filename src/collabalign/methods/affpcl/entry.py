"""AffPCL, the entry point: every agent's own feature/target arrays, one personalised least-squares model per agent (and
the central one) back, trained by the package's driver (`algorithm.run`) with AffPCL or one of its baselines.

    from collabalign.methods.affpcl import AffPCLConfig, train_affpcl
    result = train_affpcl(AffPCLConfig(steps=4000, alpha=0.01), "agents.npz")   # X_<agent> (n_i, d), y_<agent> (n_i,)
    result.arrays["solution/alice"]; result.save("runs/affpcl")                  # arrays.safetensors + manifest

The problem (docs/affpcl-problem.md): a sample is one row s = (phi, y) of an agent's data, A(s) = phi phi^T and
b(s) = phi y for every agent, and agent i samples its own rows uniformly (mu^i). Agent i's system is its own least
squares, the central one the pooled least squares with every agent weighted equally; the central objective is b itself
(known at every sample: AffPCL's "oracle"), and the density ratios rho^i(s) = mu^i(s) / mu^0(s) are exact over the
pooled rows. Agents collaborate through the rows they share; on disjoint rows rho^i(s^j) = n [i = j] and AffPCL's
update is independent learning's (the paper's delta_env = 1 case).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign.artifacts import Result
from collabalign.config import Strict
from collabalign.data.errors import DataError
from collabalign.data.formats import file_hash
from collabalign.data.names import NameBook
from collabalign.data.npz import read_npz
from collabalign.methods.affpcl.algorithm import AffPCL, run
from collabalign.methods.affpcl.baselines import IL, Ditto, FineTune, OneStepFedAvg, PFedMe
from collabalign.seeding import Seeds

MethodName = Literal["affpcl", "il", "fedavg", "ditto", "pfedme", "finetune"]
Agents = Mapping[str, tuple[np.ndarray, np.ndarray]]


class AffPCLConfig(Strict):
    """Personalised least squares per agent with AffPCL (or a baseline) over one shared driver."""

    method: MethodName = "affpcl"
    steps: PositiveInt = 4000
    alpha: PositiveFloat = 0.01  # step size at step 0; keep alpha * max ||phi||^2 below ~1 for stability
    decay: NonNegativeFloat = 0.0  # step t uses alpha / (1 + decay t); 0: constant
    batch: PositiveInt = 8  # rows each agent draws per step
    reg: PositiveFloat = 15.0  # Ditto / pFedMe: pull towards the global model
    pretrain_ratio: float = Field(0.5, gt=0, lt=1)  # finetune: share of steps spent on FedAvg
    trace_points: PositiveInt = 50  # how many points of the error curve the metrics keep
    seed: NonNegativeInt = 0


class RowBatch(NamedTuple):
    phi: np.ndarray  # features (1, n, B, d)
    y: np.ndarray  # targets (1, n, B)
    row: np.ndarray  # ids of the distinct pooled rows (1, n, B), for the exact density ratios


def _residual(phi: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minibatch least-squares direction mean_b phi_b (phi_b . w - y_b), (1, n, d); w per agent or common (1, d)."""
    if w.ndim == 2:
        w = w[:, None]
    return np.einsum("rnbd,rnb->rnd", phi, np.einsum("rnbd,rnd->rnb", phi, w) - y) / phi.shape[2]


class AgentArrays:
    """The user's agents as an AffPCL problem (problem.py) with one run: sampling, directions, exact density ratios
    and the error against each agent's own least-squares solution `xstar` (n, d)."""

    runs = 1

    def __init__(self, agents: Agents, batch: int):
        xs, ys = [np.asarray(a[0], float) for a in agents.values()], [np.asarray(a[1], float) for a in agents.values()]
        self.n, self.d, self.batch = len(xs), xs[0].shape[1], batch
        self.sizes = np.array([len(y) for y in ys])
        self.start = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.x, self.y = np.concatenate(xs), np.concatenate(ys)
        _, row = np.unique(np.column_stack([self.x, self.y]), axis=0, return_inverse=True)
        self.row = row.ravel()
        share = np.stack([np.bincount(self.row[s:s + k], minlength=self.row.max() + 1) / k
                          for s, k in zip(self.start, self.sizes, strict=True)])  # mu^i over the distinct rows, (n, U)
        self.rho = share / share.mean(0)  # rho^i(u) = mu^i(u) / mu^0(u)
        self.xstar = np.stack([np.linalg.lstsq(x, y, rcond=None)[0] for x, y in zip(xs, ys, strict=True)])

    def train_mse(self, models: np.ndarray) -> np.ndarray:
        """Each agent's mean squared error on its own rows, (n,), for models (n, d)."""
        err = np.einsum("kd,kd->k", self.x, models[np.repeat(np.arange(self.n), self.sizes)]) - self.y
        return np.bincount(np.repeat(np.arange(self.n), self.sizes), err**2) / self.sizes

    def draw(self, steps: int, rng: np.random.Generator) -> np.ndarray:
        """The uniforms that pick every step's rows, (T, 1, n, B)."""
        return rng.uniform(size=(steps, 1, self.n, self.batch))

    def sample(self, draws: np.ndarray, t: int, models: np.ndarray) -> RowBatch:
        idx = self.start[:, None] + np.minimum((draws[t] * self.sizes[:, None]).astype(int), self.sizes[:, None] - 1)
        return RowBatch(self.x[idx], self.y[idx], self.row[idx])

    def grad(self, x: np.ndarray, batch: RowBatch) -> np.ndarray:
        return _residual(batch.phi, x, batch.y)

    def error(self, models: np.ndarray) -> np.ndarray:
        return ((models - self.xstar) ** 2).sum(-1)

    def central_start(self, central: str, weights: str) -> None:
        if central != "oracle" or weights != "exact":
            raise ValueError("agent arrays: the central objective is b itself (oracle), the density ratios exact")
        return None

    def bias_correction(self, xc: np.ndarray, est: None, batch: RowBatch) -> np.ndarray:
        return _residual(batch.phi, xc, batch.y)

    def importance_corrected(self, corr: np.ndarray, xc: np.ndarray, est: None, batch: RowBatch, x: np.ndarray,
                             weights: str) -> np.ndarray:
        """(1/n) sum_j mean_b rho^i(s^j_b) phi_b (phi_b . x^c - y_b): each sample's central direction, reweighted."""
        phi = batch.phi[0]
        per = phi * (phi @ xc[0] - batch.y[0])[..., None]  # (n_j, B, d)
        return np.einsum("ijb,jbd->id", self.rho[:, batch.row[0]], per)[None] / (self.batch * self.n)

    def coe(self, est: None, batch: RowBatch, a: np.ndarray) -> None:
        return None


def _check(agents: Agents, where: str) -> None:
    """Shapes, finite values and one feature width for all agents; errors name the data and the array."""
    if not agents:
        raise DataError(where, None, None, "no agents: expected X_<agent> / y_<agent> arrays")
    width = None
    for name, (x, y) in agents.items():
        x, y = np.asarray(x), np.asarray(y)
        if x.ndim != 2 or x.shape[0] == 0:
            raise DataError(where, None, None, f"array 'X_{name}': shape {x.shape}, expected (rows > 0, features)")
        if y.ndim != 1:
            raise DataError(where, None, None, f"array 'y_{name}': shape {y.shape}, expected (rows,)")
        if y.shape[0] != x.shape[0]:
            raise DataError(where, None, None, f"array 'y_{name}': {y.shape[0]} rows, X_{name} has {x.shape[0]}")
        for label, arr in ((f"X_{name}", x), (f"y_{name}", y)):
            if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
                raise DataError(where, None, None, f"array {label!r}: dtype {arr.dtype}, expected real numbers")
            bad = np.argwhere(~np.isfinite(arr))
            if bad.size:
                raise DataError(where, None, None, f"array {label!r}: not finite at row {bad[0][0]}")
        width = x.shape[1] if width is None else width
        if x.shape[1] != width:
            raise DataError(where, None, None, f"array 'X_{name}': {x.shape[1]} features, other agents have {width}")


def load_agents(data: str | Path | Agents) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """Validated per-agent arrays and their sha256, from a dict {agent: (X, y)} or an .npz of X_<agent> / y_<agent>;
    agents are names (`data.names`)."""
    if isinstance(data, Mapping):
        where = "data"
        book = NameBook(where, "agent")
        agents = {book.add(k, None): (np.asarray(x), np.asarray(y)) for k, (x, y) in data.items()}
    else:
        where = str(data)
        arrays = read_npz(where)
        for key in arrays:
            if key[:2] not in ("X_", "y_") or len(key) < 3:
                raise DataError(where, None, None, f"array {key!r}: expected names X_<agent> and y_<agent>")
            if f"{'y' if key[0] == 'X' else 'X'}_{key[2:]}" not in arrays:
                raise DataError(where, None, None, f"array {key!r} has no {'y' if key[0] == 'X' else 'X'}_{key[2:]}")
        book = NameBook(where, "agent")
        agents = {book.add(k[2:], None): (arrays[k], arrays[f"y_{k[2:]}"]) for k in arrays if k.startswith("X_")}
    _check(agents, where)
    if where != "data":
        return agents, file_hash(where)
    digest = hashlib.sha256()
    for name, (x, y) in agents.items():
        for part in (name.encode(), np.ascontiguousarray(x, float).tobytes(), np.ascontiguousarray(y, float).tobytes()):
            digest.update(part)
    return agents, digest.hexdigest()


def _method(config: AffPCLConfig) -> tuple[Any, Any]:
    """The driver's method object and how to read its central model (R, d) from its final state (None: it has none)."""
    return {"affpcl": (AffPCL(central="oracle"), lambda s: s.xc), "il": (IL(), None),
            "fedavg": (OneStepFedAvg(), lambda s: s), "ditto": (Ditto(config.reg), lambda s: s[1]),
            "pfedme": (PFedMe(config.reg), lambda s: s[1]),
            "finetune": (FineTune(config.pretrain_ratio), lambda s: s[0])}[config.method]


class _Kept:
    """A driver method that remembers its last state, so the entry point can read the central model it trained."""

    def __init__(self, method: Any):
        self.method, self.state = method, None

    def start(self, problem: Any, steps: int, rng: np.random.Generator | None) -> Any:
        return self.method.start(problem, steps, rng)

    def step(self, problem: Any, state: Any, batch: Any, a: np.ndarray, t: int) -> Any:
        self.state = self.method.step(problem, state, batch, a, t)
        return self.state

    def held(self, problem: Any, state: Any) -> np.ndarray:
        return self.method.held(problem, state)


def train_affpcl(config: AffPCLConfig, data: str | Path | Agents, model: None = None,
                 progress: bool = False) -> Result:
    """Trains every agent's personalised model; `result.arrays` holds "solution/<agent>" (d,) and, for methods with
    one, "central" (d,); the metrics each agent's training MSE and squared distance to its own least-squares solution.
    `model` must stay None (AffPCL learns linear models, no language model); `progress` is accepted for the common
    shape (a run takes seconds)."""
    if model is not None:
        raise ValueError("AffPCL learns linear models on the agents' arrays: pass model=None")
    agents, data_hash = load_agents(data)
    problem = AgentArrays(agents, config.batch)
    method, central = _method(config)
    kept = _Kept(method)
    every = max(1, config.steps // config.trace_points)
    alpha = config.alpha / (1.0 + config.decay * np.arange(config.steps))
    errors, held = run(kept, problem, config.steps, alpha, Seeds(config.seed).numpy("affpcl/draws"), every=every)
    models = held[0]
    names = list(agents)
    arrays = {f"solution/{name}": models[i].copy() for i, name in enumerate(names)}
    if central is not None:
        arrays["central"] = np.asarray(central(kept.state))[0].copy()
    def per_agent(values: np.ndarray) -> dict[str, float]:
        return dict(zip(names, values.tolist(), strict=True))

    metrics = {"agents": len(names), "features": problem.d, "rows": problem.sizes.tolist(),
               "train_mse": per_agent(problem.train_mse(models)), "ls_error": per_agent(problem.error(held)[0]),
               "ls_train_mse": per_agent(problem.train_mse(problem.xstar)),
               "trace": {"steps": [every * (k + 1) for k in range(len(errors))],
                         "ls_error": errors[:, 0].mean(-1).tolist()}}
    return Result("affpcl", "arrays", "linear", config.model_dump(), data_hash, metrics, arrays=arrays)
