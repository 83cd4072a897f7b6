"""FedAvg over any adapter state (a dict of named arrays), the local-only reference, and the
`LocalTrainer` seam they share. Centralised training is FedAvg with one client holding all data."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import numpy as np
import torch

from collabalign.comm import Message, Params
from collabalign.federation.aggregation import Aggregation, combine
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext, evaluate_per_client, mean_min_max
from collabalign.federation.server_opt import CORRECTED, ServerOptimizer, initial_moments, server_step
from collabalign.methods.drift import Correction
from collabalign.seeding import Seeds


class LocalTrainer(Protocol):
    """Trains and evaluates one model from a parameter dict; holds no state between calls. It may also offer
    `train_many(params_list, data_list, rngs)`, `train` for many clients in one computation, which FedAvg and
    LocalOnly then use (`train_together`)."""

    def initial_params(self, seeds: Seeds) -> Params: ...

    def train(self, params: Params, data: Any, rng: torch.Generator) -> tuple[Params, int]:
        """Local training from `params` on `data`; returns the new params and the number of samples used. A trainer
        that also takes `correction=` (`methods.drift.Correction`) can run FedProx and SCAFFOLD clients."""
        ...

    def evaluate(self, params: Params) -> dict[str, float]: ...


def train_together(
    trainer: LocalTrainer, starts: list[Params], clients: list[ClientContext]
) -> list[tuple[Params, int]]:
    """Each client's local training from its start, on its data with its generator: in one computation when the
    trainer offers `train_many`, else one after the other. (A subclass that overrides `client_update` alone is not
    routed here: the engine then runs its clients one by one, `federation.engine.batched_update`.)"""
    data, rngs = [c.data for c in clients], [c.torch_rng for c in clients]
    if (train_many := getattr(trainer, "train_many", None)) is not None:
        return train_many(starts, data, rngs)
    return [trainer.train(p, d, g) for p, d, g in zip(starts, data, rngs, strict=True)]


class FedAvg:
    """FedAvg (McMahan et al. 2017): broadcast the global params, train locally, average weighted by samples; or
    combine them by a robust rule or with client-level DP (`aggregation`)."""

    def __init__(self, trainer: LocalTrainer, aggregation: Aggregation | None = None):
        self.trainer, self.aggregation = trainer, aggregation or Aggregation()

    def init(self, seeds: Seeds) -> Params:
        return self.trainer.initial_params(seeds)

    def configure(self, state: Params, round_: int, client_ids: list[str]) -> dict[str, Message]:
        msg = Message(state, {"round": round_})
        return {cid: msg for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        params, n = self.trainer.train(dict(message), client.data, client.torch_rng)
        return Message(params, {"n": n})

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]) -> dict[str, Message]:
        """Every sampled client's `client_update`, in one computation when the trainer can (`train_together`)."""
        trained = train_together(self.trainer, [dict(m) for m in messages.values()], [clients[c] for c in messages])
        return {cid: Message(params, {"n": n}) for cid, (params, n) in zip(messages, trained, strict=True)}

    def aggregate(self, state: Params, replies: dict[str, Message], round_: int) -> Params:
        ordered = [replies[cid] for cid in sorted(replies)]
        return combine(state, ordered, np.array([r.meta["n"] for r in ordered]), self.aggregation, round_)

    def evaluate(self, state: Params, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.trainer.evaluate(state)

    def params(self, state: Params) -> Params:
        """The global parameters a server state holds."""
        return state


CONTROL = "control/"  # SCAFFOLD: the prefix of the control variates' arrays in messages and client state


class FedOpt(FedAvg):
    """FedAvg with a server optimiser (`federation.server_opt`: FedAvgM, FedProx, SCAFFOLD, FedAdagrad, FedAdam,
    FedYogi, or FedAvg at a server step size): the clients' parameters combined as FedAvg combines them, then the
    server's step from there. Server state: {"params": the global parameters, "moments": the rule's moments, and for
    SCAFFOLD "control": c}; the moments never leave the server. FedProx and SCAFFOLD clients train one after another
    with a gradient correction (`methods.drift`), so their trainer must take `correction=`; SCAFFOLD sends c with the
    parameters, each client keeps its c_i in its private state and replies with Δc_i beside its parameters (both
    counted in the ledger), and needs the number of clients N and the trainer's local lr."""

    def __init__(self, trainer: LocalTrainer, aggregation: Aggregation | None = None,
                 server: ServerOptimizer | None = None, clients: int | None = None):
        super().__init__(trainer, aggregation)
        self.server, self.clients = server or ServerOptimizer(), clients
        rule, name = self.server.rule, type(trainer).__name__
        if rule in CORRECTED and "correction" not in inspect.signature(trainer.train).parameters:
            raise ValueError(f"server_optimizer {rule} corrects the local gradients, which {name} cannot")
        if rule == "scaffold" and not (clients and getattr(trainer, "lr", None)):
            raise ValueError(f"server_optimizer scaffold needs the number of clients and {name}'s local lr")

    def init(self, seeds: Seeds) -> dict[str, Any]:
        params = self.trainer.initial_params(seeds)
        state = {"params": params, "moments": initial_moments(self.server, params)}
        if self.server.rule == "scaffold":
            state["control"] = {n: np.zeros_like(p) for n, p in params.items()}
        return state

    def configure(self, state: dict[str, Any], round_: int, client_ids: list[str]) -> dict[str, Message]:
        control = {CONTROL + n: c for n, c in state.get("control", {}).items()}
        msg = Message({**state["params"], **control}, {"round": round_})
        return {cid: msg for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        if self.server.rule not in CORRECTED:
            return super().client_update(message, client)
        params = {n: v for n, v in message.items() if not n.startswith(CONTROL)}
        c = {n: message[CONTROL + n] for n in params if CONTROL + n in message}
        c_i = {n: client.state.get(CONTROL + n, np.zeros_like(v)) for n, v in c.items()}
        correction = Correction.of(params, mu=self.server.mu) if self.server.rule == "fedprox" else \
            Correction.of(params, shift={n: c[n] - c_i[n] for n in c})
        trained, n = self.trainer.train(params, client.data, client.torch_rng, correction=correction)
        if self.server.rule == "fedprox":
            return Message(trained, {"n": n})
        scale = 1.0 / (max(correction.steps, 1) * self.trainer.lr)  # option II: c_i+ = c_i - c + (x - y_i) / (K lr)
        new = {k: (c_i[k] - c[k] + (params[k].astype(np.float64) - trained[k]) * scale).astype(c[k].dtype) for k in c}
        client.state = {**client.state, **{CONTROL + k: v for k, v in new.items()}}
        return Message({**trained, **{CONTROL + k: new[k] - c_i[k] for k in c}}, {"n": n})

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]) -> dict[str, Message]:
        if self.server.rule in CORRECTED:  # one after another: each with its own correction
            return {cid: self.client_update(m, clients[cid]) for cid, m in messages.items()}
        return super().client_update_many(messages, clients)

    def aggregate(self, state: dict[str, Any], replies: dict[str, Message], round_: int) -> dict[str, Any]:
        trained = {cid: Message({n: v for n, v in r.items() if not n.startswith(CONTROL)}, r.meta)
                   for cid, r in replies.items()}
        combined = super().aggregate(state["params"], trained, round_)
        params, moments = server_step(self.server, state["params"], combined, state["moments"])
        new = {"params": params, "moments": moments}
        if "control" in state:  # c <- c + (1/N) sum of the replies' Δc_i
            new["control"] = {n: (c + sum(r[CONTROL + n].astype(np.float64) for r in replies.values())
                                  / self.clients).astype(c.dtype) for n, c in state["control"].items()}
        return new

    def evaluate(self, state: dict[str, Any], clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return self.trainer.evaluate(state["params"])

    def params(self, state: dict[str, Any]) -> Params:
        return state["params"]


def fedavg(trainer: LocalTrainer, aggregation: Aggregation | None = None,
           server: ServerOptimizer | None = None, clients: int | None = None) -> FedAvg:
    """FedAvg, or `FedOpt` when the server optimiser does more than take the combined parameters."""
    if server is None or server.plain:
        return FedAvg(trainer, aggregation)
    return FedOpt(trainer, aggregation, server, clients)


class LocalOnly:
    """Each client trains alone from the same initial params (sent once, in round 1); nothing is averaged.

    Reported metrics are the mean, min and max over clients of the trainer's metrics on the held-out set.
    """

    def __init__(self, trainer: LocalTrainer):
        self.trainer = trainer

    def init(self, seeds: Seeds) -> Params:
        return self.trainer.initial_params(seeds)

    def configure(self, state: Params, round_: int, client_ids: list[str]) -> dict[str, Message]:
        msg = Message(state if round_ == 1 else {}, {"round": round_})
        return {cid: msg for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        start = client.state or dict(message)
        params, n = self.trainer.train(start, client.data, client.torch_rng)
        client.state = params
        return Message({}, {"n": n})

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]) -> dict[str, Message]:
        """Every sampled client's `client_update`, in one computation when the trainer can (`train_together`)."""
        starts = [clients[cid].state or dict(m) for cid, m in messages.items()]
        trained = train_together(self.trainer, starts, [clients[cid] for cid in messages])
        for cid, (params, _) in zip(messages, trained, strict=True):
            clients[cid].state = params
        return {cid: Message({}, {"n": n}) for cid, (_, n) in zip(messages, trained, strict=True)}

    def reply_spec(self, state: Params, message: Message, cid: str) -> ReplySpec:
        """Only the sample count comes back."""
        return ReplySpec({})

    def aggregate(self, state: Params, replies: dict[str, Message], round_: int) -> Params:
        return state

    def evaluate(self, state: Params, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state: Params, client: ClientContext, round_: int) -> dict[str, float]:
        """The trainer's metrics of the client's own model (the initial params until it has trained)."""
        return self.trainer.evaluate(client.state or state)

    def combine_metrics(self, state: Params, per_client: dict[str, dict[str, float]], round_: int) -> dict[str, float]:
        """Mean, min and max over clients of each metric."""
        return mean_min_max(per_client)
