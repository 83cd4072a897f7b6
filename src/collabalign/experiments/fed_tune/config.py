"""The federated fine-tuning comparison's config: data, model and training sections, the server optimisers compared and
the splits they are compared under."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.config import Distinct, Grid, Strict
from collabalign.federation.engine import EngineOptions
from collabalign.federation.server_opt import ServerOptimizer


class DataConfig(Strict):
    source: Literal["hh-rlhf", "jsonl"] = "hh-rlhf"  # HH-RLHF harmless pairs of the shared data folder, or your pairs
    path: str | None = None  # jsonl: a preference-pairs file (data/formats.py)
    max_pairs: PositiveInt | None = 800  # the first N valid pairs whose prompts fit
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_prompt_tokens: PositiveInt = 96  # longer prompts (chat template included) are left out and counted
    max_response_tokens: PositiveInt = 48  # replies are cut here
    split_key: str = "topic"  # the attribute the Dirichlet split is over (HH-RLHF: the keyword topic; JSONL: domain)

    @model_validator(mode="after")
    def _path_with_jsonl(self) -> DataConfig:
        if (self.source == "jsonl") != (self.path is not None):
            raise ValueError("data.path is needed with data.source jsonl, and read with it only")
        return self


class TrainConfig(Strict):
    model: str = "smollm2-135m"
    targets: Grid[str] = ["lm_head"]  # the LM head alone: the frozen trunk's states are cached once
    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    clients: PositiveInt = 4
    rounds: PositiveInt = 3
    local_steps: PositiveInt = 8  # centralised: clients x local_steps per round, the same compute
    batch_size: PositiveInt = 8
    lr: PositiveFloat = 1e-3  # AdamW, every arm
    beta: PositiveFloat = 0.1  # DPO
    device: str = "cpu"


def default_optimizers() -> dict[str, ServerOptimizer]:
    """FedAvg and the six other rules at the settings their papers recommend (fixed before any run): FedAvgM
    β = 0.9 (Hsu et al. 2019), FedProx μ = 0.01 (Li et al. 2020), SCAFFOLD option II, and the adaptive rules at
    η = 0.01, τ = 1e-3 (Reddi et al. 2021)."""
    adaptive = {"lr": 0.01, "tau": 1e-3}
    return {"fedavg": ServerOptimizer(), "fedavgm": ServerOptimizer(rule="fedavgm", lr=1.0, beta1=0.9),
            "fedprox": ServerOptimizer(rule="fedprox", mu=0.01), "scaffold": ServerOptimizer(rule="scaffold"),
            "fedadagrad": ServerOptimizer(rule="fedadagrad", **adaptive),
            "fedadam": ServerOptimizer(rule="fedadam", **adaptive),
            "fedyogi": ServerOptimizer(rule="fedyogi", **adaptive)}


class Config(Strict):
    seeds: Grid[NonNegativeInt] = [0, 1, 2, 3, 4]
    objectives: Grid[Literal["sft", "dpo"]] = ["sft", "dpo"]
    dirichlet_alpha: PositiveFloat = 0.1  # the heterogeneous split, beside the iid one
    optimizers: dict[str, ServerOptimizer] = Field(default_factory=default_optimizers)
    upload_bits: Distinct[Literal[4, 8]] = [8, 4]  # FedAvg with quantised uploads, on the iid split (none: [])
    others_on_iid: bool = True  # the other optimisers on the iid split too (the orderings use only Dirichlet runs)
    validation: bool = False  # a pilot: score on a held-out slice of the training pairs; the test pairs stay unseen
    data: DataConfig = DataConfig()
    train: TrainConfig = TrainConfig()
    engine: EngineOptions = EngineOptions()

    @model_validator(mode="after")
    def _fedavg_first(self) -> Config:
        if "fedavg" not in self.optimizers or not self.optimizers["fedavg"].plain:
            raise ValueError("optimizers must hold fedavg (the plain average): every comparison is against it")
        return self
