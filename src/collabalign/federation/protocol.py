"""The Algorithm protocol: four pure-ish hooks that the simulator and the Flower adapter both drive.

Rules that keep both paths equal: an algorithm keeps no mutable state of its own between calls (the
server's lives in the ServerState it returns; a client's in `ClientContext.state`, a dict of numpy
arrays that is never sent); randomness comes only from the generators in the ClientContext or from the
`Seeds` given to `init`; everything that crosses between parties is a `Message`.
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
