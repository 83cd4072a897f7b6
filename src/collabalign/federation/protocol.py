"""The Algorithm protocol: four pure-ish hooks that the simulator and the Flower adapter both drive.

Rules that keep both paths equal: an algorithm keeps no mutable state of its own between calls (the
server's lives in the ServerState it returns; a client's in `ClientContext.state`, a dict of numpy
arrays that is never sent); randomness comes only from the generators in the ClientContext or from the
`Seeds` given to `init`; everything that crosses between parties is a `Message`.

Client-side evaluation (optional): an algorithm whose metrics need the clients' private state (personalised methods)
offers `client_metrics(state, client, round) -> metrics` (one client, where its state lives) and
`combine_metrics(state, {client id: metrics}, round) -> metrics`; its `evaluate` is then `evaluate_per_client`, so
the simulator (in process) and Flower (on the nodes, `engine.evaluate`) compute the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from collabalign.comm import Message
from collabalign.seeding import Seeds

ServerState = Any


@dataclass
class ClientContext:
    """What a client update sees: its id, data, private state (persists across rounds) and this round's rngs."""

    cid: str
    data: Any
    state: dict[str, np.ndarray] = field(default_factory=dict)
    rng: np.random.Generator | None = None
    torch_rng: torch.Generator | None = None

    def seed_round(self, seeds: Seeds, round_: int) -> None:
        """Sets this round's generators from (seed, round, client id): identical on every execution path."""
        key = f"{round_}:{self.cid}"
        self.rng = seeds.numpy("client", key)
        self.torch_rng = seeds.torch("client", key)


@runtime_checkable
class Algorithm(Protocol):
    def init(self, seeds: Seeds) -> ServerState: ...

    def configure(self, state: ServerState, round_: int, client_ids: list[str]) -> dict[str, Message]: ...

    def client_update(self, message: Message, client: ClientContext) -> Message: ...

    def aggregate(self, state: ServerState, replies: dict[str, Message], round_: int) -> ServerState: ...

    def evaluate(self, state: ServerState, clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        """Metrics after a round; `clients` lets personalised methods evaluate their private state."""
        ...


def has_client_metrics(algorithm: Any) -> bool:
    """Whether `algorithm` offers the client-side evaluation hooks (`client_metrics` and `combine_metrics`)."""
    return hasattr(algorithm, "client_metrics") and hasattr(algorithm, "combine_metrics")


def mean_min_max(per_client: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean, min and max over clients of each metric (`<metric>`, `<metric>_min`, `<metric>_max`)."""
    out = {}
    for key in next(iter(per_client.values())):
        vals = np.array([m[key] for m in per_client.values()])
        out.update({key: float(vals.mean()), f"{key}_min": float(vals.min()), f"{key}_max": float(vals.max())})
    return out


def evaluate_per_client(algorithm: Any, state: ServerState, clients: dict[str, ClientContext],
                        round_: int) -> dict[str, float]:
    """`combine_metrics` over every client's `client_metrics`, in client id order: the `evaluate` of an algorithm
    with the client-side hooks, the same combination Flower computes from its nodes' answers."""
    per_client = {cid: algorithm.client_metrics(state, clients[cid], round_) for cid in sorted(clients)}
    return algorithm.combine_metrics(state, per_client, round_)
