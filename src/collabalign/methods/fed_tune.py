"""Federated SFT and federated DPO of a LoRA policy, the entry point: preference pairs (SFT trains on the chosen
replies, DPO on the pairs), any Hugging Face causal LM, clients by their `user` field, an iid split, or a Dirichlet
split over an attribute (`domain` in the JSONL format, `topic` for HH-RLHF); FedAvg or any server optimiser; one global
policy adapter back.

    from collabalign.methods.fed_tune import FedTuneConfig, train_fed_tune
    result = train_fed_tune(FedTuneConfig(objective="dpo", rounds=5), "pairs.jsonl")
    result.save("runs/dpo")          # adapters/policy: a PEFT folder for the causal LM
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.artifacts import Adapter, Result
from collabalign.baselines import compare
from collabalign.config import LoRASection, Strict
from collabalign.data.errors import DataError
from collabalign.data.formats import pairs_and_hash
from collabalign.data.partition import by_key, dirichlet, iid
from collabalign.data.preferences import PreferenceSet
from collabalign.federation.aggregation import Aggregation
from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.federation.server_opt import ServerOptimizer
from collabalign.lora.peft_io import peft_adapter
from collabalign.methods.fedavg import fedavg
from collabalign.methods.policy_trainer import PolicyTrainer, base_ranking_accuracy, encode_policy_pairs
from collabalign.models.backbones import Backbone
from collabalign.models.reward import pair_correct
from collabalign.models.saved import own_backbone
from collabalign.policy.model import Policy, lora_targets
from collabalign.seeding import Seeds


class FedTuneConfig(Strict):
    """Federated fine-tuning of a LoRA policy: SFT on the chosen replies or DPO on the pairs."""

    objective: Literal["sft", "dpo"] = "sft"
    model: str = "smollm2-135m"
    lora: LoRASection = LoRASection(rank=8, alpha=16.0, targets=["lm_head"])  # LM head only: its trunk is cached
    clients: PositiveInt = 4  # clients of an iid or Dirichlet split (pairs with a `user` field: one per user)
    split: Literal["iid", "dirichlet"] = "iid"  # when the pairs carry no `user` field
    split_key: str = "domain"  # the attribute the Dirichlet split is over (HH-RLHF: topic)
    dirichlet_alpha: PositiveFloat = 0.1
    rounds: PositiveInt = 5
    local_steps: PositiveInt = 10  # AdamW steps per client and round
    batch_size: PositiveInt = 8
    lr: PositiveFloat = 1e-3
    beta: PositiveFloat = 0.1  # DPO's KL strength
    max_prompt_tokens: PositiveInt = 256  # longer prompts are left out (counted in the metrics)
    max_response_tokens: PositiveInt = 64  # replies are cut here
    test_fraction: float = Field(0.2, ge=0, lt=1)  # pairs held out for the reported NLL or accuracy
    seed: NonNegativeInt = 0
    aggregation: Aggregation = Aggregation()
    server_optimizer: ServerOptimizer = ServerOptimizer()  # FedAvg(M), FedProx, SCAFFOLD, FedAdagrad, FedAdam, FedYogi
    engine: EngineOptions = EngineOptions()

    @model_validator(mode="after")
    def _dropout_free(self) -> FedTuneConfig:
        if self.lora.dropout:
            raise ValueError("lora.dropout must be 0: the trainer runs the policy in eval mode (as TRL's DPO)")
        return self


def train_fed_tune(config: FedTuneConfig, data: str | Path | PreferenceSet, model: Backbone | str | None = None,
                   progress: bool = False) -> Result:
    """Trains the global policy; the held-out metric (SFT: `nll`; DPO: `accuracy` and `loss`, beside the base model's
    own ranking `base_accuracy`) and per-round metrics are in `result.metrics`, the policy in
    `result.adapters["policy"]`."""
    return fed_tune_job(config, data, model).run(progress)


def fed_tune_job(config: FedTuneConfig, data: str | Path | PreferenceSet,
                 model: Backbone | str | None = None) -> FederatedJob:
    """The run `train_fed_tune` simulates, for any engine."""
    pairs, data_hash = pairs_and_hash(data)
    backbone, name = own_backbone(model, config.model, ("max_prompt_tokens + max_response_tokens",
                                                         config.max_prompt_tokens + config.max_response_tokens))
    seeds = Seeds(config.seed)
    policy = Policy(backbone, lora_targets(backbone, config.lora), config.lora.rank, config.lora.alpha, 0.0,
                    generator=seeds.torch("policy/lora"))
    kept = [p for p in pairs.pairs if prompt_tokens(policy, p.prompt) <= config.max_prompt_tokens]
    if len(kept) < 2:
        raise DataError(getattr(pairs, "source", "pairs"), None, "prompt",
                        f"{len(kept)} of {len(pairs)} pairs have prompts within max_prompt_tokens="
                        f"{config.max_prompt_tokens}")
    rng = seeds.numpy("fed-tune/split")
    order = rng.permutation(len(kept))
    n_test = round(config.test_fraction * len(kept))
    test_rows, train_rows = np.sort(order[:n_test]), np.sort(order[n_test:])
    parts = split_clients(config, [kept[i] for i in train_rows], rng)
    encode = lambda rows: encode_policy_pairs(policy, [kept[i] for i in rows], config.objective,  # noqa: E731
                                              config.max_prompt_tokens, config.max_response_tokens)
    train, test = encode(train_rows), encode(test_rows if n_test else train_rows)
    trainer = PolicyTrainer(policy, config.objective, test, config.lr, config.local_steps, config.batch_size,
                            config.beta)
    clients = {f"client{i}": train[part] for i, part in enumerate(parts)}
    algorithm = fedavg(trainer, config.aggregation, config.server_optimizer, clients=len(clients))

    def finish(sim: SimulationResult) -> Result:
        metrics = {"rounds": sim.metrics, "clients": len(clients), "client_pairs": [len(p) for p in parts],
                   "train_pairs": len(train_rows), "test_pairs": n_test,
                   "long_prompts_left_out": len(pairs) - len(kept), "bytes": sim.ledger.total()}
        if n_test:
            metrics.update({k: v for k, v in sim.metrics[-1].items() if k != "round"})
            base = trainer.scores(trainer.initial_params(seeds))  # the reference, adapters at zero
            metrics["base"] = trainer.summary(base)
            if config.objective == "dpo":
                metrics["base_accuracy"] = base_ranking_accuracy(test)
            metrics["baseline"] = base_policy_baseline(trainer, trainer.scores(algorithm.params(sim.state)), base)
        policy.load_adapter_state(algorithm.params(sim.state))  # the trained policy, saved and returned
        adapter = Adapter(*peft_adapter(policy.model, None, "", name, task_type="CAUSAL_LM"))
        return Result(f"fed-{config.objective}", "policy", name, config.model_dump(), data_hash, metrics,
                      {"policy": adapter}, max_length=config.max_prompt_tokens + config.max_response_tokens,
                      model=policy)

    return FederatedJob(f"fed-{config.objective}", algorithm, clients, config.rounds, config.seed, config.engine,
                        finish)


def base_policy_baseline(trainer: PolicyTrainer, ours: torch.Tensor, base: torch.Tensor) -> dict:
    """The trained policy against the base policy (adapters at zero) on the held-out pairs, from their `scores`: SFT
    by the chosen reply's NLL per token, DPO by the policy's own ranking (its log-probability margin of chosen over
    rejected, above 0) against the base model's (`baselines.compare`)."""
    if trainer.objective == "sft":
        return compare("NLL per token of the chosen reply", ours.numpy(), base.numpy(), "the base policy (no adapter)",
                       lower_is_better=True)
    margin = trainer.test.ref_chosen - trainer.test.ref_rejected
    return compare("ranking accuracy (the policy's own log-probabilities)", pair_correct(margin + ours / trainer.beta,
                   torch.zeros_like(margin)).numpy(), pair_correct(margin, torch.zeros_like(margin)).numpy(),
                   "the base policy's ranking")


def prompt_tokens(policy: Policy, prompt: str) -> int:
    """The prompt's length in tokens as the policy encodes it (chat template included)."""
    return int(policy.encode([prompt], max_prompt_tokens=10**9)[1].sum())


def split_clients(config: FedTuneConfig, pairs: list, rng: np.random.Generator) -> list[np.ndarray]:
    """The training pairs' clients: one per `user` when every pair names one, else `config.split` over
    `config.clients` (Dirichlet over the `split_key` attribute, which every pair must carry)."""
    users = [p.party for p in pairs]
    if all(u is not None for u in users):
        return list(by_key(users).values())
    if config.split == "iid":
        return iid(len(pairs), config.clients, rng)
    labels = [p.attributes.get(config.split_key) for p in pairs]
    missing = next((i for i, label in enumerate(labels) if label is None), None)
    if missing is not None:
        raise DataError("pairs", None, config.split_key,
                        f"a Dirichlet split needs every pair's {config.split_key!r}; training pair {missing} has none")
    return dirichlet(labels, config.clients, config.dirichlet_alpha, rng, min_size=config.batch_size)
