"""The round engine that the in-process simulator and the Flower adapter share: sampling, dispatch through a
transport, reply validation, fault handling, aggregation, evaluation, checkpoints and resume.

A round: sample clients (`sample_clients`), `configure`, hand the messages to the transport, which returns each
client's reply or a `Failure` (it raised, timed out, never answered, sent bytes that do not parse). Every reply is
checked against the algorithm's `ReplySpec` (names, shapes, dtypes, finite values, sample count > 0, optionally an
update-norm bound), then against the round's other replies: by default one whose update norm is more than
`outlier_factor` times the median of the others' is rejected (`outliers`). A failed or rejected client is dropped from
the round, counted and named in the round's metric record (``dropped``, ``dropped_clients``) and in
`SimulationResult.faults`, and never reaches `aggregate`, so the server state is exactly what it would be had that
client not been sampled. An aggregate that holds a non-finite value, or one beyond float32's range, is never
committed: the reply with the largest update norm is rejected and the round aggregated again without it
(`_aggregate`). The round goes on when at least `min_replies` valid replies came back; otherwise the run stops with
`RoundFailed`, the state stays that of the last completed round, and its checkpoint lets it resume.

Evaluation: an algorithm with the client-side hooks `client_metrics` / `combine_metrics` (see `protocol.py`) is
evaluated where its clients' private state lives: the transport's `evaluate` returns each client's metrics (Flower asks
its nodes), or None, and then `algorithm.evaluate` runs here (in process, where it computes the same combination).
A client that does not answer an evaluation is left out of that record and named in its ``eval_missing``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from collabalign.comm import Ledger, Message
from collabalign.config import Strict
from collabalign.federation.checkpoint import Checkpoint
from collabalign.federation.protocol import Algorithm, ClientContext, ServerState, has_client_metrics
from collabalign.seeding import Seeds

OUTLIER_FACTOR = 100.0  # the default; honest replies of the shipped quick configs stay below 10 (docs/concepts.md)
FLOAT32_MAX = float(np.finfo(np.float32).max)


class EngineOptions(Strict):
    """Where rounds run, and fault handling of the round engine (the defaults change nothing for well-behaved
    clients)."""

    engine: Literal["simulator", "flower"] = Field(
        "simulator", description="in process, or on Flower's simulation engine (no per-round checkpoints there)")
    min_replies: int = Field(1, ge=1, description="valid replies a round needs (all, when fewer are sampled), else "
                             "the run stops (resumable)")
    timeout_s: float | None = Field(None, gt=0, description="a client slower than this is dropped from the round")
    max_update_norm: float | None = Field(None, gt=0, description="reject replies whose update norm exceeds this")
    clip_norm: float | None = Field(None, gt=0, description="scale every accepted update to at most this L2 norm")
    outlier_factor: float | None = Field(
        OUTLIER_FACTOR, gt=1, description="reject a reply whose update norm is more than this many times the median "
        "of the round's other valid replies' (from 2 valid replies on); null: off")
    batched: bool = Field(True, description="in process: the sampled clients train in one batched computation when "
                          "the algorithm can (client_update_many); false: one after another")
    upload_bits: Literal[8, 4] | None = Field(None, description="each reply's update sent as 8- or 4-bit codes "
                                              "(unbiased stochastic rounding, federation.quantise); null: full "
                                              "precision")

    @model_serializer(mode="wrap")
    def _without_default_outlier_factor(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumped without `outlier_factor` at its default, which changes no honest run's numbers, nor `upload_bits` when
        off: config snapshots and cache keys written before these settings existed still match."""
        data = handler(self)
        if self.outlier_factor == OUTLIER_FACTOR:
            del data["outlier_factor"]
        if self.upload_bits is None:
            del data["upload_bits"]
        return data


@dataclass(frozen=True)
class ReplySpec:
    """What a valid reply holds: array name -> (shape, dtype), -1 in a shape for a size the server cannot know;
    `base` holds the arrays an update is measured from
    (a reply array minus its base is the client's update; arrays without a base are updates themselves); `count`:
    the metadata must carry the client's sample count ``n`` > 0."""

    arrays: dict[str, tuple[tuple[int, ...], str]]
    base: dict[str, np.ndarray] = field(default_factory=dict)
    count: bool = True

    @classmethod
    def mirror(cls, message: Message, count: bool = True) -> ReplySpec:
        """The reply carries the broadcast's arrays back, trained (FedAvg's convention and the default)."""
        return cls({k: (v.shape, v.dtype.str) for k, v in message.items()}, dict(message), count)


@dataclass(frozen=True)
class Failure:
    """A client that did not give a usable reply this round: kind is 'error', 'timeout', 'missing' or 'corrupt'."""

    kind: str
    reason: str


class RoundFailed(RuntimeError):
    """Fewer than `min_replies` valid replies: the run stops; its checkpoint holds the last completed round."""


@dataclass
class SimulationResult:
    state: ServerState
    clients: dict[str, ClientContext]
    metrics: list[dict[str, Any]]  # one record per evaluated round, deterministic
    ledger: Ledger
    timing: list[dict[str, float]] = field(default_factory=list)  # per round: wall, client and server seconds
    faults: list[dict[str, Any]] = field(default_factory=list)  # per dropped client: round, client, kind, reason


class Transport(Protocol):
    def exchange(self, round_: int, messages: dict[str, Message]) -> dict[str, Message | Failure]:
        """Each message delivered to its client; its reply (or why there is none) returned by client id."""
        ...

    def evaluate(self, round_: int, state: ServerState) -> dict[str, dict[str, float]] | None:
        """Each client's `client_metrics` computed where its private state lives, by client id (clients that do not
        answer are absent); None: the clients are in this process, so `algorithm.evaluate` runs here."""
        ...


def sample_clients(seeds: Seeds, round_: int, client_ids: list[str], fraction: float) -> list[str]:
    """A seeded subset of max(1, round(fraction * n)) clients, in the original order; a fresh draw each round."""
    if not 0 < fraction <= 1:
        raise ValueError(f"client fraction must be in (0, 1], got {fraction}")
    n = max(1, round(fraction * len(client_ids)))
    if n == len(client_ids):
        return list(client_ids)
    chosen = seeds.numpy("sampling", round_).choice(len(client_ids), size=n, replace=False)
    return [client_ids[i] for i in sorted(chosen)]


def reply_spec(algorithm: Algorithm, state: ServerState, message: Message, cid: str) -> ReplySpec:
    """The algorithm's `reply_spec(state, message, cid)` if it has one, else the reply mirrors the message."""
    hook = getattr(algorithm, "reply_spec", None)
    return hook(state, message, cid) if hook is not None else ReplySpec.mirror(message)


def decoded(algorithm: Algorithm, reply: Message, message: Message) -> Message | Failure:
    """The reply as the client computed it, where the algorithm encodes its uploads (`decode_reply`: quantised
    uploads); a reply it cannot decode is rejected."""
    decode = getattr(algorithm, "decode_reply", None)
    if decode is None:
        return reply
    try:
        return decode(reply, message)
    except (ValueError, TypeError, KeyError) as err:
        return Failure("rejected", f"undecodable reply: {err}")


def update_norm(reply: Message, spec: ReplySpec) -> float:
    """Global L2 norm of the client's update (reply minus its base), in float64."""
    total = 0.0
    for name in spec.arrays:
        delta = reply[name].astype(np.float64) - spec.base.get(name, 0.0)
        total += float(np.sum(delta * delta))
    return float(np.sqrt(total))


def check_reply(reply: Any, spec: ReplySpec, max_norm: float | None = None) -> str | None:
    """Why `reply` is unusable (one line), or None when it is valid."""
    if not isinstance(reply, Message):
        return f"not a Message but {type(reply).__name__}"
    missing, extra = sorted(set(spec.arrays) - set(reply)), sorted(set(reply) - set(spec.arrays))
    if missing or extra:
        return f"array names differ: missing {missing}, unexpected {extra}"
    for name, (shape, dtype) in spec.arrays.items():
        arr = reply[name]
        fits = len(arr.shape) == len(shape) and all(e < 0 or a == e for a, e in zip(arr.shape, shape, strict=True))
        if not fits or arr.dtype.str != dtype:
            return f"{name!r} is {arr.dtype.str}{list(arr.shape)}, expected {dtype}{list(shape)}"
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return f"{name!r} holds non-finite values"
    if spec.count:
        n = reply.meta.get("n")
        if isinstance(n, bool) or not isinstance(n, int | float) or not np.isfinite(n) or n <= 0:
            return f"sample count n = {n!r}, must be > 0"
    if max_norm is not None and (norm := update_norm(reply, spec)) > max_norm:
        return f"update norm {norm:.4g} exceeds {max_norm:g}"
    return None


def outliers(norms: dict[str, float], factor: float | None) -> dict[str, str]:
    """The clients whose update norm is above `factor` times the median of the other clients' norms, with why; none
    when `factor` is None, with a single reply, or where that median is 0 (no scale to compare with)."""
    if factor is None:
        return {}
    found = {}
    for cid, norm in norms.items():
        others = [v for c, v in norms.items() if c != cid]
        median = float(np.median(others)) if others else 0.0
        if median > 0 and norm > factor * median:
            found[cid] = (f"update norm {norm:.4g} is {norm / median:.3g} times the median {median:.4g} of the "
                          f"round's other replies (outlier_factor {factor:g})")
    return found


def within_float32(tree: Any) -> bool:
    """Whether every float in a state tree (dicts, lists, tuples, arrays, scalars) is finite and within float32's
    range."""
    if isinstance(tree, dict):
        return all(within_float32(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return all(within_float32(v) for v in tree)
    if isinstance(tree, np.ndarray | float | np.floating) and np.asarray(tree).dtype.kind == "f":
        return bool(np.all(np.abs(tree) <= FLOAT32_MAX))
    return True


def clip_update(reply: Message, spec: ReplySpec, bound: float) -> Message:
    """The reply with its update scaled to L2 norm at most `bound` (unchanged when already within)."""
    norm = update_norm(reply, spec)
    if norm <= bound:
        return reply
    scale = bound / norm
    arrays = {}
    for name, arr in reply.items():
        base = spec.base.get(name)
        if name not in spec.arrays or arr.dtype.kind != "f":
            arrays[name] = arr
        elif base is None:
            arrays[name] = (arr.astype(np.float64) * scale).astype(arr.dtype)
        else:
            arrays[name] = (base + (arr.astype(np.float64) - base) * scale).astype(arr.dtype)
    return Message(arrays, reply.meta)


@dataclass
class Run:
    """Everything the rounds so far produced; a checkpoint stores the state (with the clients' private state) and
    one log line per round, from which the lists are rebuilt."""

    state: ServerState
    metrics: list[dict[str, Any]] = field(default_factory=list)
    timing: list[dict[str, float]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)
    faults: list[dict[str, Any]] = field(default_factory=list)
    round: int = 0

    def log_line(self, rnd: int, record: dict[str, Any] | None) -> dict[str, Any]:
        """Round `rnd`'s part of the lists (its metric record, if it was evaluated)."""
        rows = list(itertools.takewhile(lambda r: r[0] == rnd, reversed(self.ledger.rows)))[::-1]
        return {"round": rnd, "metrics": record, "ledger": [list(r) for r in rows],
                "timing": self.timing[-1] if rnd else None, "faults": [f for f in self.faults if f["round"] == rnd]}

    @classmethod
    def restore(cls, saved: tuple[int, Any, list[dict[str, Any]]], clients: dict[str, ClientContext]) -> Run:
        round_, tree, log = saved
        for cid, private in tree["client_states"].items():
            clients[cid].state = private
        run = cls(tree["state"], round=round_)
        for line in log:
            run.metrics += [line["metrics"]] if line["metrics"] is not None else []
            run.timing += [line["timing"]] if line["timing"] is not None else []
            run.ledger.rows += [tuple(r) for r in line["ledger"]]
            run.faults += line["faults"]
        return run

    def save(self, checkpoint: Checkpoint | None, clients: dict[str, ClientContext],
             record: dict[str, Any] | None) -> None:
        if checkpoint is not None:
            checkpoint.append(self.log_line(self.round, record))
            private = {c: x.state for c, x in clients.items()}
            checkpoint.save(self.round, {"state": self.state, "client_states": private})


def run_rounds(algorithm: Algorithm, transport: Transport, clients: dict[str, ClientContext], rounds: int, seed: int,
               fraction: float = 1.0, eval_every: int = 1, options: EngineOptions | None = None,
               checkpoint: Checkpoint | None = None,
               on_round: Callable[[int, dict[str, Any]], None] | None = None) -> SimulationResult:
    """Rounds 1..`rounds` of `algorithm` (round 0 evaluates the initial state). With a `checkpoint`, every completed
    round is saved and a run that finds one continues from it, ending as an uninterrupted run would."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    options = options or EngineOptions()
    seeds, ids = Seeds(seed), list(clients)
    sample_clients(seeds, 1, ids, fraction)  # validates the fraction before any work
    if checkpoint is not None and checkpoint.exists:
        saved = checkpoint.load()
        checkpoint.reset(saved[2])
        run = Run.restore(saved, clients)
    else:
        run = Run(algorithm.init(seeds))
        run.metrics.append({"round": 0, **evaluate(algorithm, transport, run.state, clients, 0)})
        if checkpoint is not None:
            checkpoint.reset([])
        run.save(checkpoint, clients, run.metrics[0])
        if on_round is not None:
            on_round(0, run.metrics[0])
    for rnd in range(run.round + 1, rounds + 1):
        t0 = time.perf_counter()
        messages = algorithm.configure(run.state, rnd, sample_clients(seeds, rnd, ids, fraction))
        for cid, msg in messages.items():
            run.ledger.record(rnd, cid, "down", msg.nbytes)
        t1 = time.perf_counter()
        outcomes = transport.exchange(rnd, messages)
        t2 = time.perf_counter()
        accepted, norms = _screen(algorithm, rnd, messages, outcomes, options, run)
        run.state = _aggregate(algorithm, rnd, len(messages), accepted, norms, options, run)
        t3 = time.perf_counter()
        record = None
        if rnd % eval_every == 0 or rnd == rounds:
            record = {"round": rnd, **evaluate(algorithm, transport, run.state, clients, rnd)}
            since = run.metrics[-1]["round"]
            dropped = {f"{f['client']}@{f['round']}": f"{f['kind']}: {f['reason']}" for f in run.faults
                       if f["round"] > since}
            if dropped:  # every client dropped since the last record, named with its round
                record |= {"dropped": len(dropped), "dropped_clients": dropped}
            run.metrics.append(record)
        run.timing.append({"round": rnd, "wall_s": time.perf_counter() - t0, "client_s": t2 - t1,
                           "server_s": (t1 - t0) + (t3 - t2)})
        run.round = rnd
        run.save(checkpoint, clients, record)
        if on_round is not None:
            on_round(rnd, run.metrics[-1])
    return SimulationResult(run.state, clients, run.metrics, run.ledger, run.timing, run.faults)


def evaluate(algorithm: Algorithm, transport: Transport, state: ServerState, clients: dict[str, ClientContext],
             round_: int) -> dict[str, Any]:
    """The metrics of `state`: combined from the clients' own metrics when the transport evaluates remotely and
    the algorithm has the client-side hooks, else `algorithm.evaluate` in this process."""
    per_client = transport.evaluate(round_, state) if has_client_metrics(algorithm) else None
    if per_client is None:
        return algorithm.evaluate(state, clients, round_)
    answered = {cid: per_client[cid] for cid in sorted(per_client)}
    record = algorithm.combine_metrics(state, answered, round_) if answered else {}
    missing = sorted(set(clients) - set(answered))
    return record | ({"eval_missing": missing} if missing else {})


def _screen(algorithm: Algorithm, rnd: int, messages: dict[str, Message], outcomes: dict[str, Message | Failure],
            options: EngineOptions, run: Run) -> tuple[dict[str, Message], dict[str, float]]:
    """The valid replies that are not outliers, in `configure`'s order (clipped if asked), and their update norms
    (before clipping); every other client is recorded as dropped."""
    valid, specs = {}, {}
    for cid, msg in messages.items():
        out = outcomes.get(cid, Failure("missing", "no reply"))
        if isinstance(out, Message):
            run.ledger.record(rnd, cid, "up", out.nbytes)
            out = decoded(algorithm, out, msg)
        if isinstance(out, Message):
            specs[cid] = reply_spec(algorithm, run.state, msg, cid)
            problem = check_reply(out, specs[cid], options.max_update_norm)
            if problem is None:
                valid[cid] = out
                continue
            out = Failure("rejected", problem)
        elif not isinstance(out, Failure):
            out = Failure("rejected", f"not a Message but {type(out).__name__}")
        _drop(run, rnd, cid, out)
    norms = {cid: update_norm(reply, specs[cid]) for cid, reply in valid.items()}
    for cid, reason in outliers(norms, options.outlier_factor).items():
        _drop(run, rnd, cid, Failure("rejected", reason))
        del valid[cid], norms[cid]
    if options.clip_norm is not None:
        valid = {cid: clip_update(reply, specs[cid], options.clip_norm) for cid, reply in valid.items()}
    return valid, norms


def _aggregate(algorithm: Algorithm, rnd: int, sampled: int, accepted: dict[str, Message], norms: dict[str, float],
               options: EngineOptions, run: Run) -> ServerState:
    """The round's new server state. While the aggregate holds a non-finite value or one beyond float32's range, it
    is discarded, the reply with the largest update norm is rejected and the rest aggregated again; `RoundFailed`
    (the state untouched) once fewer than `min_replies` remain (all of them, when fewer were sampled)."""
    while True:
        if len(accepted) < min(options.min_replies, sampled):
            dropped = {f["client"]: f"{f['kind']}: {f['reason']}" for f in run.faults if f["round"] == rnd}
            raise RoundFailed(f"round {rnd}: {len(accepted)} valid replies of {sampled}, min_replies = "
                              f"{options.min_replies}; dropped: {dropped}")
        state = algorithm.aggregate(run.state, accepted, rnd)
        if within_float32(state):
            return state
        culprit = max(accepted, key=norms.__getitem__)
        reason = f"the aggregate with this reply (update norm {norms[culprit]:.4g}) is non-finite or beyond float32"
        _drop(run, rnd, culprit, Failure("rejected", reason))
        accepted = {cid: reply for cid, reply in accepted.items() if cid != culprit}


def _drop(run: Run, rnd: int, cid: str, failure: Failure) -> None:
    """Records `cid` as dropped from round `rnd`."""
    run.faults.append({"round": rnd, "client": cid, "kind": failure.kind, "reason": failure.reason})


def batched_update(algorithm: Algorithm):
    """The algorithm's `client_update_many`, unless a subclass overrode `client_update` below it (a wrapper that
    injects faults or logs per client): then None, and its clients run one by one through the override. One set on
    the instance is used as it is."""
    many = getattr(algorithm, "client_update_many", None)
    if many is None or "client_update_many" in getattr(algorithm, "__dict__", {}):
        return many

    def owner(name: str) -> type:
        return next(c for c in type(algorithm).__mro__ if name in vars(c))

    return many if issubclass(owner("client_update_many"), owner("client_update")) else None


class InProcess:
    """Calls each client's update in this process (the batched `client_update_many` when the algorithm has one; if
    it raises, the clients are retried one by one so only the faulty one is dropped). A client that raises or runs
    past `timeout_s` gets its private state back as it was before the round."""

    def __init__(self, algorithm: Algorithm, clients: dict[str, ClientContext], seed: int,
                 timeout_s: float | None = None, batched: bool = True):
        self.algorithm, self.clients, self.seeds, self.timeout_s = algorithm, clients, Seeds(seed), timeout_s
        self.batched = batched

    def exchange(self, round_: int, messages: dict[str, Message]) -> dict[str, Message | Failure]:
        saved = {cid: dict(self.clients[cid].state) for cid in messages}
        for cid in messages:
            self.clients[cid].seed_round(self.seeds, round_)
        batched = batched_update(self.algorithm) if self.batched else None
        if batched is not None and len(messages) > 1 and self.timeout_s is None:
            try:
                return dict(batched(messages, {cid: self.clients[cid] for cid in messages}))
            except Exception:  # noqa: BLE001 - a client's bug must not end the run; retried one by one below
                for cid in messages:
                    self.clients[cid].state = dict(saved[cid])
                    self.clients[cid].seed_round(self.seeds, round_)
        return {cid: self._one(cid, msg, saved[cid]) for cid, msg in messages.items()}

    def evaluate(self, round_: int, state: ServerState) -> None:
        """The clients are here: `algorithm.evaluate` runs in this process."""
        return None

    def _one(self, cid: str, message: Message, saved: dict[str, np.ndarray]) -> Message | Failure:
        client, start = self.clients[cid], time.perf_counter()
        try:
            reply = self.algorithm.client_update(message, client)
        except Exception as err:  # noqa: BLE001 - recorded as this client's failure
            client.state = saved
            return Failure("error", f"{type(err).__name__}: {err}")
        if self.timeout_s is not None and (took := time.perf_counter() - start) > self.timeout_s:
            client.state = saved
            return Failure("timeout", f"took {took:.1f} s > {self.timeout_s:g} s")
        return reply
