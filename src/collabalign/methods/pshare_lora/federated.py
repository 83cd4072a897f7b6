"""P-ShareLoRA with users as federated clients (beyond the paper): the routed LoRA reward model's local trainer, and
the personal algorithms (P-ShareLoRA SI / G / WU, LoRA-local) as `Algorithm`s. FedAvg-LoRA is the project's one
`methods.fedavg.FedAvg` over the same trainer.

The server holds the shared parameters (P-ShareLoRA: every LoRA layer's up-projection B and any other trainable
parameter, e.g. a score head), sends them each round, and averages the clients' replies weighted by sample count.
Each client keeps its personal parameters (P-ShareLoRA: the down-projections A_i) in `ClientContext.state`; they are
never sent. Model-agnostic: `model_fn` builds any reward model with LoRA layers (`lora_layers`), base frozen, a head
trainable if it has one. A client trains one copy of that model in which every factor is a plain matrix, so the
user index of its rows plays no part; client data: {"user": global index, "train": Prefs, "test": Prefs}.

Initial factors as in the centralised SI (spec §3.3, §9.4): one kaiming draw of A, B = 0. The draw is derived from
the run's seed: a client's first personal message carries that seed in its metadata and the client draws A itself,
so every client gets the same A and no A-shaped array is sent. G / WU: the first `global_rounds` rounds are
FedAvg-LoRA (A travels too); then the averaged A is handed to each client once, in its first personal round, and
stays private from then on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from collabalign.comm import Message
from collabalign.federation.protocol import ClientContext
from collabalign.lora import lora_layers, routed
from collabalign.methods.fedavg import Params, weighted_average
from collabalign.methods.pshare_lora.sharing import project_
from collabalign.methods.pshare_lora.train import Prefs, batches, pair_loss
from collabalign.models.reward import pair_correct
from collabalign.seeding import Seeds

Kind = Literal["A", "B", "head"]
INIT_STREAM = "federated-lora/init"  # the Seeds stream of the run's initial draw


@dataclass(frozen=True)
class LocalSteps:
    """A client's work per round: `steps` steps of a fresh optimiser on its own pairs (batch_size 0: all of them)."""

    steps: int = 10
    lr: float = 0.02
    optimizer: Literal["adam", "sgd"] = "adam"
    batch_size: int = 0


def user_data(train: Prefs, test: Prefs, n_users: int) -> dict[str, dict[str, Any]]:
    """Client id ('user000', ...) -> that user's index and its train / test rows."""
    return {f"user{u:03d}": {"user": u, "train": train[train.users == u], "test": test[test.users == u]}
            for u in range(n_users)}


def kinds(model: nn.Module) -> dict[str, Kind]:
    """Trainable parameter name -> 'A' / 'B' for LoRA factors, 'head' for any other trainable parameter."""
    lora = {f"{name}.{f}": f for name in lora_layers(model) for f in ("A", "B")}
    return {n: lora.get(n, "head") for n, p in model.named_parameters() if p.requires_grad}


def personal_bytes(clients: Mapping[str, ClientContext]) -> int:
    """Bytes of the private state held on the clients (what never left them)."""
    return sum(a.nbytes for c in clients.values() for a in c.state.values())


class RoutedLoRA:
    """Local training of one LoRA reward model from a parameter dict: FedAvg-LoRA's `LocalTrainer` and the local
    step of the personal algorithms. It keeps one scratch copy of the model, into which every call first loads all
    trainable parameters, so nothing carries over between calls. `tests`: the users' held-out pairs `evaluate`
    scores (FedAvg's evaluation has the global parameters only)."""

    def __init__(self, model_fn: Callable[[], nn.Module], local: LocalSteps, max_norm: float | None = None,
                 tests: Sequence[Prefs] = ()):
        self.model = model_fn()
        self.kinds = kinds(self.model)
        if not any(k == "A" for k in self.kinds.values()):
            raise ValueError("the model has no LoRA layer")
        self.initial = self.params()
        self.local, self.max_norm, self.tests = local, max_norm, tuple(tests)

    def params(self) -> Params:
        """Every trainable parameter of the scratch model as a float32 array."""
        return {n: p.detach().numpy().copy() for n, p in self.model.named_parameters() if n in self.kinds}

    def load(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets every trainable parameter of the scratch model (all must be given)."""
        missing = set(self.kinds) - set(params)
        if missing:
            raise KeyError(f"parameters not given: {sorted(missing)}")
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in self.kinds:
                    p.copy_(torch.from_numpy(np.asarray(params[n])))

    def start(self, generator: torch.Generator) -> Params:
        """Initial parameters: one kaiming draw of every A from `generator` (layers in order, as `prepare`), B = 0,
        the model's head."""
        self.load(self.initial)
        for layer in lora_layers(self.model).values():
            layer.reset_parameters(generator)
        return self.params()

    # ---- the LocalTrainer protocol (FedAvg-LoRA) ----
    def initial_params(self, seeds: Seeds) -> Params:
        return self.start(torch.Generator().manual_seed(seeds.entropy(INIT_STREAM)))

    def train(self, params: Params, data: dict[str, Any], rng: torch.Generator | None) -> tuple[Params, int]:
        return self.fit(params, data["train"], rng, self.local.lr), len(data["train"])

    def train_many(self, starts: list[Params], data: list[dict[str, Any]],
                   rngs: list[torch.Generator | None]) -> list[tuple[Params, int]]:
        """`train` for many clients in one computation (see `fit_many`)."""
        trained = self.fit_many(starts, [d["train"] for d in data], rngs, self.local.lr)
        return [(p, len(d["train"])) for p, d in zip(trained, data, strict=True)]

    def evaluate(self, params: Params) -> dict[str, float]:
        """Mean and lowest held-out accuracy over the users' test sets of one model for all."""
        return summary([self.accuracy(params, test) for test in self.tests])

    # ---- training and scoring ----
    def fit(self, params: Params, data: Prefs, rng: torch.Generator | None, lr: float) -> Params:
        """`local.steps` steps of a fresh Adam / SGD from `params`, projecting after each step if asked."""
        self.load(params)
        opt = self.optimiser([p for n, p in self.model.named_parameters() if n in self.kinds], lr)
        stream = batches(len(data), self.local.batch_size, rng)
        for _ in range(self.local.steps):
            self.step(opt, pair_loss(self.model, data[next(stream)]))
        return self.params()

    def fit_many(self, starts: list[Params], data: list[Prefs], rngs: list[torch.Generator | None],
                 lr: float) -> list[Params]:
        """`fit` for many clients in one computation: each LoRA factor stacked over clients (a leading client
        dimension) and the sum of the clients' mean losses minimised, which gives each client exactly its own
        gradients (and, Adam being elementwise, its own optimiser). A trainable head is not stacked: such a model
        trains its clients one after the other."""
        if any(k == "head" for k in self.kinds.values()):
            return [self.fit(s, d, g, lr) for s, d, g in zip(starts, data, rngs, strict=True)]
        originals = {n: p for n, p in self.model.named_parameters() if n in self.kinds}
        try:
            for n in self.kinds:
                _set_factor(self.model, n, nn.Parameter(torch.from_numpy(np.stack([s[n] for s in starts]))))
            self.fit_stacked(data, rngs, lr)
            trained = {n: p.detach().numpy() for n, p in self.model.named_parameters() if n in self.kinds}
        finally:
            for n, p in originals.items():
                _set_factor(self.model, n, p)
        return [{n: trained[n][i].copy() for n in self.kinds} for i in range(len(starts))]

    def fit_stacked(self, data: list[Prefs], rngs: list[torch.Generator | None], lr: float) -> None:
        """Local steps for clients whose factors are stacked: rows routed to their client, each client's batch from
        its own stream, loss = sum over clients of their mean Bradley–Terry loss."""
        sizes = torch.tensor([len(d) for d in data])
        offsets = torch.cumsum(sizes, 0) - sizes
        party = torch.repeat_interleave(torch.arange(len(data)), sizes)
        chosen = torch.cat([d.chosen for d in data])
        rejected = torch.cat([d.rejected for d in data])
        streams = [batches(len(d), self.local.batch_size, g) for d, g in zip(data, rngs, strict=True)]
        opt = self.optimiser([p for p in self.model.parameters() if p.requires_grad], lr)
        for _ in range(self.local.steps):
            idx = torch.arange(len(party)) if self.local.batch_size <= 0 else \
                torch.cat([off + next(s) for off, s in zip(offsets, streams, strict=True)])
            p = party[idx]
            with routed(self.model, torch.cat([p, p])):
                r = self.model(torch.cat([chosen[idx], rejected[idx]]))
            nll = -torch.nn.functional.logsigmoid(r[:len(idx)] - r[len(idx):])
            self.step(opt, (nll / torch.bincount(p, minlength=len(data))[p]).sum())

    def optimiser(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr) if self.local.optimizer == "adam" else torch.optim.SGD(params, lr=lr)

    def step(self, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        """One optimiser step, then the per-user norm projection of every LoRA layer if asked."""
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if self.max_norm is not None:
            for layer in lora_layers(self.model).values():
                project_(layer, self.max_norm)

    def accuracy(self, params: Params, test: Prefs) -> float:
        """Held-out preference accuracy of the model with `params` on `test` (ties count half)."""
        self.load(params)
        with torch.no_grad(), routed(self.model, torch.cat([test.users, test.users])):
            r = self.model(torch.cat([test.chosen, test.rejected]))
        return float(pair_correct(r[:len(test)], r[len(test):]).mean())

    def assemble(self, shared: Params, personal: Sequence[Params] = ()) -> nn.Module:
        """A centralised-shaped model: the `shared` parameters, and for each name in the users' `personal`
        parameters (in user order) that factor stacked by user (a leading user dimension), so centralised metrics
        (`synthetic.evaluate`) apply unchanged."""
        net = copy.deepcopy(self.model)
        with torch.no_grad():
            for n, p in net.named_parameters():
                if n in self.kinds:
                    p.copy_(torch.from_numpy(shared[n]))
        for n in personal[0] if personal else ():
            if self.kinds[n] == "head":
                raise ValueError("a personal head has no centralised-shaped model with a shared head")
            _set_factor(net, n, nn.Parameter(torch.from_numpy(np.stack([params[n] for params in personal])), False))
        return net


def summary(accuracies: list[float]) -> dict[str, float]:
    """The evaluation record: mean and lowest accuracy over users."""
    return {"accuracy": float(np.mean(accuracies)), "accuracy_min": float(np.min(accuracies))}


def _set_factor(model: nn.Module, name: str, value: nn.Parameter) -> None:
    """Replaces the LoRA factor '<layer>.A' / '<layer>.B' of `model` (its shape may change: stacked per user)."""
    layer, factor = name.rsplit(".", 1)
    setattr(model.get_submodule(layer), factor, value)


class PersonalLoRA:
    """Users as clients of one LoRA reward model: parameters of the `personal` kinds stay on the clients, the others
    are sent, trained by `trainer` and averaged weighted by sample count. `global_rounds` > 0: FedAvg-LoRA first
    (everything sent), then each client continues from the global parameters at `personal_lr`."""

    def __init__(self, trainer: RoutedLoRA, personal: tuple[Kind, ...], global_rounds: int = 0,
                 personal_lr: float | None = None, independent_init: bool = False):
        self.trainer = trainer
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
        return {"params": self.start(init_seed), "init_seed": init_seed, "seen": []}

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

    def aggregate(self, state: dict[str, Any], replies: dict[str, Message], round_: int) -> dict[str, Any]:
        ordered = [replies[cid] for cid in sorted(replies)]
        params = dict(state["params"])
        if ordered and len(ordered[0]):
            params.update(weighted_average(ordered, np.array([r.meta["n"] for r in ordered])))
        seen = sorted(set(state["seen"]) | set(replies)) if self.is_personal(round_) else state["seen"]
        return {**state, "params": params, "seen": seen}

    def evaluate(self, state: dict[str, Any], clients: dict[str, ClientContext], round_: int) -> dict[str, float]:
        """Held-out accuracy of each user's own model (shared parameters + its personal ones; ties count half)."""
        return summary([self.trainer.accuracy(self.user_params(state, c, round_), c.data["test"])
                        for c in clients.values()])

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

    def __init__(self, trainer: RoutedLoRA, global_rounds: int = 0, personal_lr: float | None = None):
        super().__init__(trainer, ("A",), global_rounds, personal_lr)


class LocalLoRA(PersonalLoRA):
    """LoRA-local: every trainable parameter personal, A drawn independently per client; nothing but metadata sent."""

    def __init__(self, trainer: RoutedLoRA):
        super().__init__(trainer, ("A", "B", "head"), independent_init=True)
