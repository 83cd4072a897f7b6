"""FedAvg-LoRA reward models, the entry point: preference pairs (clients by their `user` field, else an iid split),
any Hugging Face model, one global LoRA reward model back.

    from collabalign.methods.fedavg_lora import FedAvgLoRAConfig, train_fedavg_lora
    result = train_fedavg_lora(FedAvgLoRAConfig(model="smollm2-135m", rounds=5), "pairs.jsonl")
    result.save("runs/rm")          # adapters/global: PEFT folder + head.safetensors
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign.artifacts import Result
from collabalign.baselines import compare, probe_pairs
from collabalign.config import LoRASection, Strict
from collabalign.data.formats import pairs_and_hash
from collabalign.data.partition import by_key, iid
from collabalign.data.preferences import PreferenceSet
from collabalign.federation.aggregation import Aggregation
from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.federation.server_opt import ServerOptimizer
from collabalign.lora.targets import default_targets
from collabalign.methods.fedavg import fedavg
from collabalign.methods.reward_trainer import EncodedPairs, RewardTrainer, encode_pairs
from collabalign.models.backbones import Backbone
from collabalign.models.cached import frozen_features, lora_top_blocks
from collabalign.models.reward import RewardModel, pair_correct
from collabalign.models.saved import base_prefix, own_backbone, pooled_adapter
from collabalign.seeding import Seeds


class FedAvgLoRAConfig(Strict):
    """Federated reward modelling with FedAvg over LoRA + head."""

    model: str = "smollm2-135m"
    lora: LoRASection = LoRASection(blocks=1)
    clients: PositiveInt = 4  # iid clients when the pairs carry no `user` field
    rounds: PositiveInt = 5
    local_epochs: PositiveInt = 1
    batch_size: PositiveInt = 16
    lr: PositiveFloat = 1e-3
    max_length: PositiveInt = 128
    test_fraction: float = Field(0.2, ge=0, lt=1)  # pairs held out for the reported accuracy
    seed: NonNegativeInt = 0
    aggregation: Aggregation = Aggregation()
    server_optimizer: ServerOptimizer = ServerOptimizer()  # FedAvg(M), FedProx, SCAFFOLD, FedAdagrad, FedAdam, FedYogi
    engine: EngineOptions = EngineOptions()


def train_fedavg_lora(config: FedAvgLoRAConfig, data: str | Path | PreferenceSet,
                      model: Backbone | str | None = None, progress: bool = False) -> Result:
    """Trains the global reward model; its held-out accuracy (when `test_fraction` > 0) and per-round metrics are in
    `result.metrics`, the model in `result.adapters["global"]`."""
    return fedavg_lora_job(config, data, model).run(progress)


def fedavg_lora_job(config: FedAvgLoRAConfig, data: str | Path | PreferenceSet,
                    model: Backbone | str | None = None) -> FederatedJob:
    """The run `train_fedavg_lora` simulates, for any engine."""
    pairs, data_hash = pairs_and_hash(data)
    backbone, name = own_backbone(model, config.model, ("max_length", config.max_length))
    reward = RewardModel(backbone.model, backbone.causal, Seeds(config.seed).torch("head"))
    targets = default_targets(backbone.model, config.lora.targets)
    split = lora_top_blocks(reward, config.lora.blocks or 10**6, targets, config.lora.rank, config.lora.alpha,
                            config.lora.dropout)
    encoded = encode_pairs(reward, backbone.tokenizer, pairs.pairs, config.max_length, split)
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(pairs))
    n_test = round(config.test_fraction * len(pairs))
    test_rows, train_rows = np.sort(order[:n_test]), np.sort(order[n_test:])
    users = [pairs[i].party for i in train_rows]
    parts = (list(by_key(users).values()) if all(u is not None for u in users)
             else iid(len(train_rows), config.clients, rng))
    test = encoded[test_rows] if n_test else encoded[train_rows]
    trainer = RewardTrainer(reward, test=test, lr=config.lr, epochs=config.local_epochs,
                            batch_size=config.batch_size)
    clients = {f"client{i}": encoded[train_rows[p]] for i, p in enumerate(parts)}

    algorithm = fedavg(trainer, config.aggregation, config.server_optimizer, clients=len(clients))

    def finish(sim: SimulationResult) -> Result:
        trainer.load(algorithm.params(sim.state))
        metrics = {"rounds": sim.metrics, "clients": len(clients), "train_pairs": len(train_rows),
                   "test_pairs": n_test, "bytes": sim.ledger.total()}
        if n_test:
            metrics.update(sim.metrics[-1])
            metrics["baseline"] = probe_baseline(trainer, encoded, train_rows, test_rows, backbone, name, config.seed)
        adapter = pooled_adapter(reward, base_prefix(backbone.model), name)
        return Result("fedavg-lora", "reward", name, config.model_dump(), data_hash, metrics, {"global": adapter},
                      max_length=config.max_length, model=reward)

    return FederatedJob("fedavg-lora", algorithm, clients, config.rounds, config.seed, config.engine, finish)


def probe_baseline(trainer: RewardTrainer, encoded: EncodedPairs, train_rows: np.ndarray, test_rows: np.ndarray,
                   backbone: Backbone, name: str, seed: int) -> dict[str, Any]:
    """The trained reward model (as loaded in `trainer`) against a Bradley-Terry probe on the frozen backbone's
    features of the training pairs, on the same held-out pairs (`baselines.compare`)."""
    hits = pair_correct(*trainer.test_rewards(trainer.params(), encoded[test_rows])).numpy()
    features = frozen_features(backbone.model, backbone.causal, encoded.texts).numpy()
    rows = np.arange(len(encoded))
    probe = probe_pairs(features, rows, rows + len(encoded), train_rows, test_rows, Seeds(seed).numpy("baseline-probe"))
    return compare("accuracy", hits, probe, f"a Bradley-Terry probe on frozen {name} features")
