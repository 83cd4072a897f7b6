"""AffPCL, the entry point: every agent's own feature/target arrays, one personalised least-squares model per agent (and
the central one) back, trained by the package's driver (`algorithm.run`) with AffPCL or one of its baselines, scored on
held-out rows against independent learning and FedAvg.

    from collabalign.methods.affpcl import AffPCLConfig, train_affpcl
    result = train_affpcl(AffPCLConfig(steps=4000, alpha=0.01), "agents.npz")   # X_<agent> (n_i, d), y_<agent> (n_i,)
    result.arrays["solution/alice"]; result.metrics["test_mse"]["alice"]; result.metrics["baseline"]["verdict"]
    result.save("runs/affpcl")                                                    # arrays.safetensors + manifest

The problem (docs/affpcl-problem.md): a sample is one row s = (phi, y) of an agent's data, A(s) = phi phi^T and
b(s) = phi y for every agent, and agent i samples its own training rows uniformly (mu^i). Agent i's system is its own
least squares, the central one the pooled least squares with every agent weighted equally (mu^0, the equal-weight
mixture); the central objective is b itself (known at every sample: AffPCL's "oracle").

`test_fraction` of each agent's rows (at least one, seeded) is held out before anything is fitted: the models train on
the rest, `test_mse` is each agent's mean squared error on its held-out rows, and `metrics["baseline"]` /
`metrics["baseline_fedavg"]` compare the per-row held-out squared errors (every agent weighing the same) with those of
independent learning and FedAvg, run by the same driver on the same split and draws (`baselines.compare`).

The density ratios rho^i(s) = mu^i(s) / mu^0(s):
- "estimated" (default): the paper's density-ratio estimation by a probabilistic classifier of agent identity, a
  multinomial L2 logistic regression on the standardised pooled training samples s = (phi, y), its C chosen by
  cross-validated log-loss on the training rows. With P(i|s) its probabilities and pi_i = n_i / N the agents' shares of
  the pooled rows, rho^i(s) = [P(i|s) / pi_i] / mean_j [P(j|s) / pi_j] (the rows of unequal agents reweighted so that
  mu^0 is the equal-weight mixture), kept in [0, n] (the ratios of a sample sum to n; the clip only guards rounding).
  Agents the classifier cannot tell apart get rho ~ 1 (AffPCL moves towards the pooled model); agents it separates
  perfectly get rho^i(s^j) ~ n [i = j], and AffPCL's update is independent learning's.
- "exact": over row identities of the pooled training rows, for data whose agents declare shared rows (identical
  (phi, y)). Agents collaborate only through the rows they share; on disjoint rows rho^i(s^j) = n [i = j] and AffPCL is
  independent learning exactly (the paper's delta_env = 1 case).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from sklearn.linear_model import LogisticRegression

from collabalign.artifacts import Result
from collabalign.baselines import compare
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
RATIO_C = (0.01, 0.1, 1.0, 10.0, 100.0)  # the agent classifier's inverse L2 strengths; one is chosen per run
RATIO_FOLDS = 5
BASELINES = {"il": "independent learning (each agent alone)", "fedavg": "FedAvg (one common model)"}


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
    test_fraction: float = Field(0.2, ge=0, lt=1)  # of each agent's rows, held out for test_mse and the baselines
    ratios: Literal["estimated", "exact"] = "estimated"  # exact: over row identities (agents that share rows)
    seed: NonNegativeInt = 0


class RowBatch(NamedTuple):
    phi: np.ndarray  # features (1, n, B, d)
    y: np.ndarray  # targets (1, n, B)
    row: np.ndarray  # the rows' columns of `AgentArrays.rho` (1, n, B)


def _residual(phi: np.ndarray, w: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Minibatch least-squares direction mean_b phi_b (phi_b . w - y_b), (1, n, d); w per agent or common (1, d)."""
    if w.ndim == 2:
        w = w[:, None]
    return np.einsum("rnbd,rnb->rnd", phi, np.einsum("rnbd,rnd->rnb", phi, w) - y) / phi.shape[2]


class AgentArrays:
    """The user's agents as an AffPCL problem (problem.py) with one run: sampling, directions, density ratios and the
    error against each agent's own least-squares solution `xstar` (n, d). `rho` (n, pooled rows): given density
    ratios at every pooled row (`estimated_ratios`); None: the exact ones over the distinct pooled rows."""

    runs = 1

    def __init__(self, agents: Agents, batch: int, rho: np.ndarray | None = None):
        xs, ys = [np.asarray(a[0], float) for a in agents.values()], [np.asarray(a[1], float) for a in agents.values()]
        self.n, self.d, self.batch = len(xs), xs[0].shape[1], batch
        self.sizes = np.array([len(y) for y in ys])
        self.start = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.x, self.y = np.concatenate(xs), np.concatenate(ys)
        if rho is None:
            self.weights = "exact"
            _, row = np.unique(np.column_stack([self.x, self.y]), axis=0, return_inverse=True)
            self.row = row.ravel()
            share = np.stack([np.bincount(self.row[s:s + k], minlength=self.row.max() + 1) / k
                              for s, k in zip(self.start, self.sizes, strict=True)])  # mu^i over distinct rows (n, U)
            self.rho = share / share.mean(0)  # rho^i(u) = mu^i(u) / mu^0(u)
        else:
            if rho.shape != (self.n, len(self.y)):
                raise ValueError(f"density ratios of shape {rho.shape}, expected (agents, pooled rows) = "
                                 f"{(self.n, len(self.y))}")
            self.weights, self.row, self.rho = "estimated", np.arange(len(self.y)), rho
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
        if central != "oracle" or weights != self.weights:
            raise ValueError(f"agent arrays: the central objective is b itself (oracle), the density ratios "
                             f"{self.weights}")
        return None

    def held_out_errors(self, models: np.ndarray, held_out: Agents) -> np.ndarray:
        """Every held-out row's squared error under its agent's model (models (n, d)), agent by agent."""
        return np.concatenate([(np.asarray(x, float) @ models[i] - np.asarray(y, float)) ** 2
                               for i, (x, y) in enumerate(held_out.values())])

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


def split_agents(agents: Agents, test_fraction: float, rng: np.random.Generator,
                 source: str = "data") -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """(training rows, held-out rows) of every agent, each in its original order: a random `test_fraction` of its rows
    held out (at least one when the fraction is positive), at least one left to train; an agent with too few rows is
    a DataError naming it (in `source`). Fraction 0: every row trains, none is held out."""
    train, test = {}, {}
    for name, (x, y) in agents.items():
        rows = rng.permutation(len(y))
        n_test = max(1, round(test_fraction * len(y))) if test_fraction > 0 else 0
        if len(y) - n_test < 1:
            raise DataError(source, None, None, f"too few rows: agent {name!r} has {len(y)}, at least {n_test + 1} "
                            f"are needed to hold out {n_test} and train on one (test_fraction {test_fraction})")
        kept, held = np.sort(rows[n_test:]), np.sort(rows[:n_test])
        train[name], test[name] = (x[kept], y[kept]), (x[held], y[held])
    return train, test


def estimated_ratios(agents: Agents, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    """Density ratios rho^i(s) = mu^i(s) / mu^0(s) at every pooled row s = (phi, y), (n, rows), from a probabilistic
    classifier of agent identity: a multinomial L2 logistic regression (lbfgs: deterministic) on the standardised
    (phi, y), its C from `RATIO_C` by `RATIO_FOLDS`-fold cross-validated log-loss (folds within each agent's rows, from
    `rng`; ties to the stronger regularisation; an agent with one row: C = 1). With pi_i = n_i / N,
    rho^i(s) = [P(i|s) / pi_i] / mean_j [P(j|s) / pi_j], so that mu^0 is the equal-weight mixture of the agents; the
    ratios of a sample sum to n, and the clip to [0, n] only guards rounding. Also a summary: C, the cross-validated
    log-loss per C and `own_share`, the mean over agents of rho^i / n at their own rows (1: the agents are told apart
    and AffPCL is independent learning; 1/n: they are not and every row counts alike)."""
    xs = [np.column_stack([np.asarray(x, float), np.asarray(y, float)]) for x, y in agents.values()]
    n, sizes, s = len(xs), np.array([len(v) for v in xs]), np.concatenate(xs)
    owner = np.repeat(np.arange(n), sizes)
    if n == 1:
        return np.ones((1, len(s))), {"kind": "estimated", "C": None, "cv_log_loss": {}, "own_share": 1.0}
    scale = s.std(0)
    z = (s - s.mean(0)) / np.where(scale > 0, scale, 1.0)

    def fit(rows: np.ndarray, c: float) -> LogisticRegression:
        return LogisticRegression(C=c, max_iter=2000).fit(z[rows], owner[rows])

    folds, best, cv = min(RATIO_FOLDS, int(sizes.min())), 1.0, {}
    if folds >= 2:  # every agent has a row in every fold, so every training part holds every agent
        fold = np.concatenate([rng.permutation(k) % folds for k in sizes])
        for c in RATIO_C:
            loss = 0.0
            for k in range(folds):
                p = fit(fold != k, c).predict_proba(z[fold == k])
                loss -= np.log(np.maximum(p[np.arange(len(p)), owner[fold == k]], 1e-300)).sum()
            cv[c] = loss / len(z)
        best = min(RATIO_C, key=lambda c: (cv[c], c))
    odds = fit(np.ones(len(z), bool), best).predict_proba(z) / (sizes / sizes.sum())  # P(i|s) / pi_i, (rows, n)
    rho = np.clip((odds / odds.mean(1, keepdims=True)).T, 0.0, n)
    own = np.bincount(owner, rho[owner, np.arange(len(z))]) / sizes / n
    return rho, {"kind": "estimated", "C": best, "cv_log_loss": {str(c): round(float(v), 6) for c, v in cv.items()},
                 "own_share": round(float(own.mean()), 6)}


def _method(name: str, config: AffPCLConfig) -> tuple[Any, Any]:
    """The driver's method object and how to read its central model (R, d) from its final state (None: it has none)."""
    return {"affpcl": (AffPCL(central="oracle", weights=config.ratios), lambda s: s.xc), "il": (IL(), None),
            "fedavg": (OneStepFedAvg(), lambda s: s), "ditto": (Ditto(config.reg), lambda s: s[1]),
            "pfedme": (PFedMe(config.reg), lambda s: s[1]),
            "finetune": (FineTune(config.pretrain_ratio), lambda s: s[0])}[name]


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


def _train(name: str, config: AffPCLConfig, problem: AgentArrays) -> tuple[np.ndarray, np.ndarray, Any]:
    """Method `name` run by the driver on `problem` with the config's steps, step sizes and seed (every method draws
    the same rows): its error trace (E, 1, n), final models (1, n, d) and central model (d,) or None."""
    method, central = _method(name, config)
    kept = _Kept(method)
    every = max(1, config.steps // config.trace_points)
    alpha = config.alpha / (1.0 + config.decay * np.arange(config.steps))
    errors, held = run(kept, problem, config.steps, alpha, Seeds(config.seed).numpy("affpcl/draws"), every=every)
    return errors, held, None if central is None else np.asarray(central(kept.state))[0].copy()


def held_out_baselines(config: AffPCLConfig, problem: AgentArrays, held_out: Agents,
                       ours: np.ndarray) -> dict[str, dict]:
    """The method's per-row held-out squared errors `ours` against independent learning's ("baseline") and FedAvg's
    ("baseline_fedavg"), each run by the driver on the same training rows and draws; every agent weighs the same.
    IL's own baseline is FedAvg (in "baseline"), FedAvg's is IL alone."""
    groups = np.repeat(np.arange(problem.n), [len(y) for _, y in held_out.values()])
    rivals = [b for b in BASELINES if b != config.method]
    records = {}
    for key, rival in zip(("baseline", "baseline_fedavg"), rivals, strict=False):
        theirs = problem.held_out_errors(_train(rival, config, problem)[1][0], held_out)
        records[key] = compare("held-out squared error", ours, theirs, BASELINES[rival], groups=groups,
                               lower_is_better=True)
    return records


def train_affpcl(config: AffPCLConfig, data: str | Path | Agents, model: None = None,
                 progress: bool = False) -> Result:
    """Trains every agent's personalised model on its training rows; `result.arrays` holds "solution/<agent>" (d,)
    and, for methods with one, "central" (d,); the metrics each agent's training MSE and squared distance to its own
    least-squares solution on its training rows and, when `test_fraction` > 0, its held-out MSE (`test_mse`, mean
    `test_mse_mean`) and the held-out comparisons with independent learning and FedAvg (`baseline`,
    `baseline_fedavg`), and the density ratios' summary (`ratios`). `model` must stay None (AffPCL learns linear
    models, no language model); `progress` is accepted for the common shape (a run takes seconds)."""
    if model is not None:
        raise ValueError("AffPCL learns linear models on the agents' arrays: pass model=None")
    agents, data_hash = load_agents(data)
    source = "data" if isinstance(data, Mapping) else str(data)
    train, test = split_agents(agents, config.test_fraction, Seeds(config.seed).numpy("affpcl/split"), source)
    rho, ratios = None, {"kind": "exact"}
    if config.method == "affpcl" and config.ratios == "estimated":
        rho, ratios = estimated_ratios(train, Seeds(config.seed).numpy("affpcl/ratio-folds"))
    problem = AgentArrays(train, config.batch, rho)
    errors, held, central = _train(config.method, config, problem)
    models = held[0]
    names = list(agents)
    arrays = {f"solution/{name}": models[i].copy() for i, name in enumerate(names)}
    if central is not None:
        arrays["central"] = central

    def per_agent(values: np.ndarray) -> dict[str, float]:
        return dict(zip(names, values.tolist(), strict=True))

    every = max(1, config.steps // config.trace_points)
    metrics = {"agents": len(names), "features": problem.d, "rows": problem.sizes.tolist(),
               "train_mse": per_agent(problem.train_mse(models)), "ls_error": per_agent(problem.error(held)[0]),
               "ls_train_mse": per_agent(problem.train_mse(problem.xstar)),
               "trace": {"steps": [every * (k + 1) for k in range(len(errors))],
                         "ls_error": errors[:, 0].mean(-1).tolist()}}
    if config.method == "affpcl":
        metrics["ratios"] = ratios
    if config.test_fraction > 0:
        ours = problem.held_out_errors(models, test)
        counts = np.array([len(y) for _, y in test.values()])
        test_mse = np.bincount(np.repeat(np.arange(len(names)), counts), ours) / counts
        metrics.update(test_rows=counts.tolist(), test_mse=per_agent(test_mse), test_mse_mean=float(test_mse.mean()))
        metrics.update(held_out_baselines(config, problem, test, ours))
    return Result("affpcl", "arrays", "linear", config.model_dump(), data_hash, metrics, arrays=arrays)
