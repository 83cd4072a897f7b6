"""Federated P-ShareLoRA on text, the entry point: preference pairs with a `user` field, one client per user, any
Hugging Face encoder or causal LM; each user's reward model back (its personal LoRA factors with the shared ones and
the score head). The personal factors never leave their client: on a Flower deployment (`collabalign deploy
deploy/pshare-lora`) each node keeps them in its own state folder and saves its user's model there at the end.

    from collabalign.methods.pshare_lora.federated_entry import FederatedPShareLoRAConfig, train_pshare_lora_federated
    result = train_pshare_lora_federated(FederatedPShareLoRAConfig(rounds=10), "pairs.jsonl")
    result.metrics["accuracy"]; result.save("runs/fed-prm")   # adapters/user-<user>, one per user

Methods: `pshare_si` (B and the head shared and averaged, A personal from one common draw), `pshare_wu` / `pshare_g`
(FedAvg-LoRA for the first warm-up / global share of the rounds, then A personal; G continues at a third of the
rate, as the federated experiment), `local` (nothing shared: each user trains alone, a lower bound on what
collaboration buys). FedAvg-LoRA is `collabalign train fedavg-lora`. Training runs without dropout: its draws come
from torch's global generator, which a deployment's nodes and the simulator do not share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, field_validator

from collabalign.artifacts import Result
from collabalign.config import LoRASection, Probability, Strict
from collabalign.data.preferences import PreferenceSet
from collabalign.federation.aggregation import Aggregation
from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.federation.protocol import ClientContext
from collabalign.federation.server_opt import ServerOptimizer, server_side_only
from collabalign.lora.targets import default_targets
from collabalign.methods.pshare_lora.entry import user_pairs, user_probe_baseline
from collabalign.methods.pshare_lora.federated import FederatedPShareLoRA, LocalLoRA, PersonalLoRA, personal_bytes
from collabalign.methods.pshare_lora.local_trainer import LocalSteps, RoutedLoRA
from collabalign.methods.pshare_lora.text import TextRewardModel
from collabalign.models.backbones import Backbone
from collabalign.models.saved import base_prefix, pooled_adapter
from collabalign.seeding import Seeds


class FederatedPShareLoRAConfig(Strict):
    """Personal reward models trained by their users as federated clients, one round = `local_steps` steps each."""

    model: str = "minilm-l6"
    method: Literal["pshare_si", "pshare_wu", "pshare_g", "local"] = "pshare_si"
    lora: LoRASection = LoRASection(rank=8, alpha=4.0, blocks=2, dropout=0.0)  # blocks: the top N get LoRA
    rounds: PositiveInt = 10
    local_steps: PositiveInt = 10
    lr: PositiveFloat = 3e-3
    optimizer: Literal["adam", "sgd"] = "adam"
    batch_size: NonNegativeInt = 32  # pairs a step, from the user's own (0: all of them)
    warmup_fraction: Probability = 0.1  # pshare_wu: the FedAvg-LoRA share of the rounds
    global_fraction: Probability = 2 / 3  # pshare_g: the FedAvg-LoRA share of the rounds
    max_length: PositiveInt = 128  # tokens of prompt + reply (longer texts lose their start)
    test_fraction: float = Field(0.2, ge=0, lt=1)  # of each user's pairs, held out for the reported accuracy
    fraction: float = Field(1.0, gt=0, le=1)  # users sampled a round
    seed: NonNegativeInt = 0
    aggregation: Aggregation = Aggregation()  # how the shared parameters are combined
    server_optimizer: ServerOptimizer = ServerOptimizer()  # then the server's step (fedprox / scaffold: not here)
    engine: EngineOptions = EngineOptions()

    @field_validator("lora")
    @classmethod
    def _no_dropout(cls, lora: LoRASection) -> LoRASection:
        if lora.dropout:
            raise ValueError("federated training runs without LoRA dropout (set 0)")
        return lora

    @field_validator("server_optimizer")
    @classmethod
    def _server_side(cls, server: ServerOptimizer) -> ServerOptimizer:
        return server_side_only(server, "P-ShareLoRA")


def train_pshare_lora_federated(config: FederatedPShareLoRAConfig, data: str | Path | PreferenceSet,
                                model: Backbone | str | None = None, progress: bool = False) -> Result:
    """Every user's reward model, simulated in this process; held-out accuracy (mean and lowest over users) per round
    and at the end in `result.metrics`, user u's model in `result.adapters[f"user-{u}"]`."""
    return pshare_lora_federated_job(config, data, model).run(progress)


def pshare_lora_federated_job(config: FederatedPShareLoRAConfig, data: str | Path | PreferenceSet,
                              model: Backbone | str | None = None) -> FederatedJob:
    """The run `train_pshare_lora_federated` simulates, for any engine. Client `user<k>` is the k-th user by name."""
    names, data_hash, prefs, train_rows, test_rows, backbone, base, cache = user_pairs(config, data, model)
    train, test = prefs[train_rows], prefs[test_rows if len(test_rows) else train_rows]
    clients = {f"user{u:03d}": {"user": u, "name": name, "train": train[train.users == u],
                                "test": test[test.users == u]} for u, name in enumerate(names)}
    targets = tuple(default_targets(backbone.model, config.lora.targets))
    lora = config.lora

    def model_fn() -> TextRewardModel:
        net = TextRewardModel(backbone, cache, lora.rank, lora.alpha, 0.0, len(names), False,
                              Seeds(config.seed).torch("head"), targets)
        return net.eval()  # no dropout anywhere (the backbone's own included)

    trainer = RoutedLoRA(model_fn, LocalSteps(config.local_steps, config.lr, config.optimizer, config.batch_size))
    algorithm = algorithm_of(config, trainer)
    prefix = base_prefix(backbone.model)

    def personal(state: Any, client: ClientContext) -> Result:
        """A user's own reward model after the last round (where its personal factors are: its node)."""
        trainer.load(algorithm.user_params(state, client, config.rounds))
        adapter = pooled_adapter(trainer.model.pooled, prefix, base)
        return Result("pshare-lora-federated", "reward", base, config.model_dump(), data_hash,
                      {"user": client.data["name"]}, {f"user-{client.data['name']}": adapter},
                      max_length=config.max_length, model=trainer.model)

    def finish(sim: SimulationResult) -> Result:
        """The users' models when their clients ran here (the simulator); on a deployment, each node saved its own
        and the server's result holds the shared parameters only."""
        metrics = {"rounds": sim.metrics, "users": len(names), "train_pairs": len(train_rows),
                   "test_pairs": len(test_rows), "bytes": sim.ledger.total(),
                   "personal_bytes_on_clients": personal_bytes(sim.clients)}
        if len(test_rows) and sim.metrics:
            metrics.update({k: v for k, v in sim.metrics[-1].items() if k.startswith("accuracy")})
        here = any(c.state for c in sim.clients.values()) or not algorithm.is_personal(config.rounds)
        adapters = {name: a for c in sim.clients.values() for name, a in personal(sim.state, c).adapters.items()} \
            if here else {}
        shared = {} if here else {f"shared/{n}": sim.state["params"][n] for n in algorithm.shared}
        if here and len(test_rows):  # the personal models are here to score: each user's against its own probe
            ours = torch.zeros(len(test_rows), dtype=torch.float64)
            for c in sim.clients.values():
                mine = prefs.users[test_rows] == c.data["user"]
                ours[mine] = trainer.hits(algorithm.user_params(sim.state, c, config.rounds), c.data["test"])
            metrics["baseline"] = user_probe_baseline(ours, backbone, base, cache, prefs, train_rows, test_rows,
                                                      config.seed)
        return Result("pshare-lora-federated", "reward", base, config.model_dump(), data_hash, metrics, adapters,
                      shared, max_length=config.max_length)

    return FederatedJob("pshare-lora-federated", algorithm, clients, config.rounds, config.seed, config.engine,
                        finish, fraction=config.fraction, personal=personal)


def algorithm_of(config: FederatedPShareLoRAConfig, trainer: RoutedLoRA) -> PersonalLoRA:
    """The federated algorithm of `config.method` over `trainer`."""
    if config.method == "local":
        return LocalLoRA(trainer)
    global_rounds = {"pshare_si": 0, "pshare_wu": round(config.warmup_fraction * config.rounds),
                     "pshare_g": round(config.global_fraction * config.rounds)}[config.method]
    personal_lr = config.lr / 3 if config.method == "pshare_g" else None
    return FederatedPShareLoRA(trainer, global_rounds, personal_lr, config.aggregation, config.server_optimizer)

