"""P-ShareLoRA with users as federated clients (beyond the paper): the personal algorithms (P-ShareLoRA SI / G / WU,
LoRA-local) as `Algorithm`s over the routed-LoRA trainer (`local_trainer.py`). FedAvg-LoRA is the project's one
`methods.fedavg.FedAvg` over the same trainer.

The server holds the shared parameters (P-ShareLoRA: every LoRA layer's up-projection B and any other trainable
parameter, e.g. a score head), sends them each round, and averages the clients' replies weighted by sample count.
Each client keeps its personal parameters (P-ShareLoRA: the down-projections A_i) in `ClientContext.state`; they are
never sent. Model-agnostic: `model_fn` builds any reward model with LoRA layers (`lora_layers`), base frozen, a head
trainable if it has one. Client data: {"user": global index, "train": Prefs, "test": Prefs}.

Initial factors as in the centralised SI (spec §3.3, §9.4): one kaiming draw of A, B = 0. The draw is derived from
the run's seed: a client's first personal message carries that seed in its metadata and the client draws A itself,
so every client gets the same A and no A-shaped array is sent. G / WU: the first `global_rounds` rounds are
FedAvg-LoRA (A travels too); then the averaged A is handed to each client once, in its first personal round, and
stays private from then on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from collabalign.comm import Message, Params
from collabalign.federation.aggregation import Aggregation, combine
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext, evaluate_per_client
from collabalign.federation.server_opt import ServerOptimizer, initial_moments, server_side_only, server_step
from collabalign.methods.pshare_lora.local_trainer import INIT_STREAM, Kind, RoutedLoRA, summary
from collabalign.methods.pshare_lora.train import Prefs
from collabalign.seeding import Seeds


def user_data(train: Prefs, test: Prefs, n_users: int) -> dict[str, dict[str, Any]]:
    """Client id ('user000', ...) -> that user's index and its train / test rows."""
    return {f"user{u:03d}": {"user": u, "train": train[train.users == u], "test": test[test.users == u]}
            for u in range(n_users)}


def personal_bytes(clients: Mapping[str, ClientContext]) -> int:
    """Bytes of the private state held on the clients (what never left them)."""
    return sum(a.nbytes for c in clients.values() for a in c.state.values())


class PersonalLoRA:
    """Users as clients of one LoRA reward model: parameters of the `personal` kinds stay on the clients, the others
    are sent, trained by `trainer` and combined by `aggregation` (default: averaged weighted by sample count), then
    stepped by the `server` optimiser (default: taken as combined; its moments, kept in the server state, cover every
    parameter and move only for those sent that round).
    `global_rounds` > 0: FedAvg-LoRA first (everything sent), then each client continues from the global parameters
    at `personal_lr`."""

    def __init__(self, trainer: RoutedLoRA, personal: tuple[Kind, ...], global_rounds: int = 0,
                 personal_lr: float | None = None, independent_init: bool = False,
                 aggregation: Aggregation | None = None, server: ServerOptimizer | None = None):
        self.trainer, self.aggregation = trainer, aggregation or Aggregation()
        self.server = server_side_only(server or ServerOptimizer(), "P-ShareLoRA")
        self.personal = [n for n, k in trainer.kinds.items() if k in personal]
        self.shared = [n for n in trainer.kinds if n not in self.personal]
        self.global_rounds = global_rounds
        self.personal_lr = trainer.local.lr if personal_lr is None else personal_lr
        self.independent_init = independent_init

    def start(self, init_seed: int, cid: str | None = None) -> Params:
        """Initial parameters from the run's draw; with `independent_init` each client gets its own draw of A."""
        g = Seeds(init_seed).torch("independent", cid) if self.independent_init and cid else \
            torch.Generator().manual_seed(init_seed)
        return self.trainer.start(g)

    def first_personal(self, state: dict[str, Any], cid: str) -> Params:
        """A client's personal parameters before it trains: the hand-over after a global phase, else its draw."""
        source = state["params"] if self.global_rounds > 0 else self.start(state["init_seed"], cid)
        return {n: source[n] for n in self.personal}

    def is_personal(self, round_: int) -> bool:
        """Whether `round_` runs with personal parameters (after the FedAvg-LoRA phase of G / WU)."""
        return round_ > self.global_rounds

    # ---- the Algorithm protocol ----
    def init(self, seeds: Seeds) -> dict[str, Any]:
        init_seed = seeds.entropy(INIT_STREAM)
        params = self.start(init_seed)
        moments = {} if self.server.plain else {"moments": initial_moments(self.server, params)}
        return {"params": params, "init_seed": init_seed, "seen": [], **moments}

    def configure(self, state: dict[str, Any], round_: int, client_ids: list[str]) -> dict[str, Message]:
        """Global phase: every parameter. Personal phase: the shared ones; a client's first personal message also
        carries its starting personal parameters (after a global phase) or the seed to draw them from."""
        personal = self.is_personal(round_)
        out = {}
        for cid in client_ids:
            first = personal and bool(self.personal) and cid not in state["seen"]
            names = self.shared if personal else list(self.trainer.kinds)
            meta: dict[str, Any] = {"round": round_, "personal": personal}
            if first and self.global_rounds > 0:
                names = list(self.trainer.kinds)
            elif first:
                meta["init_seed"] = state["init_seed"]
            out[cid] = Message({n: state["params"][n] for n in names}, meta)
        return out

    def client_update(self, message: Message, client: ClientContext) -> Message:
        trained = self.trainer.fit(self.begin(message, client), client.data["train"], client.torch_rng,
                                   self.lr(message))
        return self.finish(message, client, trained)

    def client_update_many(self, messages: dict[str, Message], clients: dict[str, ClientContext]) -> dict[str, Message]:
        """Every sampled client's local steps in one computation (`RoutedLoRA.fit_many`)."""
        ids = list(messages)
        starts = [self.begin(messages[cid], clients[cid]) for cid in ids]
        trained = self.trainer.fit_many(starts, [clients[cid].data["train"] for cid in ids],
                                        [clients[cid].torch_rng for cid in ids], self.lr(messages[ids[0]]))
        return {cid: self.finish(messages[cid], clients[cid], t) for cid, t in zip(ids, trained, strict=True)}

    def reply_spec(self, state: dict[str, Any], message: Message, cid: str) -> ReplySpec:
        """The sent parameters (the shared ones in the personal phase, else all) come back trained, with n."""
        sent = self.shared if message.meta["personal"] else list(self.trainer.kinds)
        return ReplySpec({n: (message[n].shape, message[n].dtype.str) for n in sent}, {n: message[n] for n in sent})

    def aggregate(self, state: dict[str, Any], replies: dict[str, Message], round_: int) -> dict[str, Any]:
        ordered = [replies[cid] for cid in sorted(replies)]
        params = dict(state["params"])
        moments = state.get("moments")
        if ordered and len(ordered[0]):
            sent = {n: params[n] for n in ordered[0]}
            combined = combine(sent, ordered, np.array([r.meta["n"] for r in ordered]), self.aggregation, round_)
            if moments is not None:  # the server optimiser's step on the sent parameters, from their moments
                combined, stepped = server_step(self.server, sent, combined,
                                                {k: {n: m[n] for n in sent} for k, m in moments.items()})
                moments = {k: {**m, **stepped[k]} for k, m in moments.items()}
            params.update(combined)
        seen = sorted(set(state["seen"]) | set(replies)) if self.is_personal(round_) else state["seen"]
        return {**state, "params": params, "seen": seen, **({} if moments is None else {"moments": moments})}

    def evaluate(self, state: dict[str, Any], clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        return evaluate_per_client(self, state, clients, round_)

    def client_metrics(self, state: dict[str, Any], client: ClientContext, round_: int) -> dict[str, float]:
        """Held-out accuracy of the user's own model (shared parameters + its personal ones; ties count half)."""
        return {"accuracy": self.trainer.accuracy(self.user_params(state, client, round_), client.data["test"])}

    def combine_metrics(self, state: dict[str, Any], per_client: dict[str, dict[str, float]],
                        round_: int) -> dict[str, float]:
        """Mean and lowest accuracy over users."""
        return summary([m["accuracy"] for m in per_client.values()])

    # ---- helpers ----
    def lr(self, message: Message) -> float:
        """The local learning rate of this round's phase."""
        return self.personal_lr if message.meta["personal"] else self.trainer.local.lr

    def begin(self, message: Message, client: ClientContext) -> Params:
        """Everything a client trains from: the message, with its personal parameters in the personal phase (set up
        on first use: the hand-over after a global phase, else drawn from the seed in the metadata)."""
        personal = message.meta["personal"]
        if personal and self.personal and not client.state:
            client.state = {n: message[n] for n in self.personal} if self.global_rounds > 0 else \
                {n: p for n, p in self.start(message.meta["init_seed"], client.cid).items() if n in self.personal}
        return {**message, **(client.state if personal else {})}

    def finish(self, message: Message, client: ClientContext, trained: Params) -> Message:
        """Keeps the trained personal parameters private and replies with the others and the sample count."""
        personal = message.meta["personal"]
        if personal:
            client.state = {n: trained[n] for n in self.personal}
        sent = self.shared if personal else list(self.trainer.kinds)
        return Message({n: trained[n] for n in sent}, {"n": len(client.data["train"])})

    def user_params(self, state: dict[str, Any], client: ClientContext, round_: int) -> Params:
        """The parameters a user's model has after `round_`: the server's, with its personal ones in effect."""
        if not (self.personal and self.is_personal(round_)):
            return state["params"]
        return {**state["params"], **(client.state or self.first_personal(state, client.cid))}

    def assemble(self, state: dict[str, Any], clients: dict[str, ClientContext], round_: int) -> nn.Module:
        """The centralised-shaped model after `round_`: the server's parameters, each user's personal ones stacked
        by user index."""
        by_user = sorted(clients.values(), key=lambda c: c.data["user"])
        if [c.data["user"] for c in by_user] != list(range(len(by_user))):
            raise ValueError("clients' user indices must be 0 .. N-1")
        personal = self.personal if self.is_personal(round_) else []
        own = [{n: self.user_params(state, c, round_)[n] for n in personal} for c in by_user] if personal else []
        return self.trainer.assemble(state["params"], own)


class FederatedPShareLoRA(PersonalLoRA):
    """P-ShareLoRA: B of every layer (and any head) shared and averaged, A_i personal. `global_rounds` > 0 gives
    the G / WU variants (FedAvg-LoRA first, then each client continues from the global A at `personal_lr`)."""

    def __init__(self, trainer: RoutedLoRA, global_rounds: int = 0, personal_lr: float | None = None,
                 aggregation: Aggregation | None = None, server: ServerOptimizer | None = None):
        super().__init__(trainer, ("A",), global_rounds, personal_lr, aggregation=aggregation, server=server)


class LocalLoRA(PersonalLoRA):
    """LoRA-local: every trainable parameter personal, A drawn independently per client; nothing but metadata sent."""

    def __init__(self, trainer: RoutedLoRA):
        super().__init__(trainer, ("A", "B", "head"), independent_init=True)
