"""The quickstart's config: data, client split, model and training sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.config import Grid, Strict
from collabalign.federation.aggregation import Aggregation
from collabalign.federation.engine import EngineOptions

JSONL_SPLITS = ("user", "domain")  # the grouping fields of a preference-pairs JSONL (data/formats.py)


class DataConfig(Strict):
    source: Literal["hh-rlhf", "synthetic", "jsonl"] = "hh-rlhf"
    path: str | None = None  # jsonl: a preference-pairs file (data/formats.py), its rows split by split.attribute
    max_pairs: PositiveInt | None = None  # the first N valid pairs of the file
    synthetic_pairs: PositiveInt = 400
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_length: PositiveInt = 64  # tokens per prompt+reply text, truncated from the left (the reply is kept)

    @model_validator(mode="after")
    def _path_with_jsonl(self) -> DataConfig:
        if self.source == "jsonl" and self.path is None:
            raise ValueError("data.source jsonl needs data.path, a preference-pairs JSONL file")
        if self.source != "jsonl" and self.path is not None:
            raise ValueError(f"data.path is read with data.source jsonl only (here: {self.source})")
        return self


class SplitConfig(Strict):
    clients: PositiveInt = 8
    attribute: str = "topic"  # the pairs' split key (HH-RLHF: keyword topic of the human turns; JSONL: user or domain)
    alpha: PositiveFloat = 0.5
    min_pairs: NonNegativeInt = 16


class ModelConfig(Strict):
    backbone: str = "minilm-l6"
    lora_blocks: PositiveInt = 1  # LoRA in the top N blocks; the blocks below run once, as cached features
    targets: Grid[str] = ["query", "value"]
    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    device: str = "cpu"  # where the LoRA blocks and the head train ("cuda" on a GPU); cached features stay on the CPU


class TrainConfig(Strict):
    rounds: PositiveInt = 10
    local_epochs: PositiveInt = 1
    batch_size: PositiveInt = 16
    lr: PositiveFloat = 1e-3  # a common LoRA default, fixed a priori and shared by all methods
    local_only_eval_every: PositiveInt = 5  # each local-only evaluation costs one test pass per client


class Config(Strict):
    seeds: Grid[NonNegativeInt] = [0]
    data: DataConfig = DataConfig()
    split: SplitConfig = SplitConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    engine: EngineOptions = EngineOptions()  # fault handling and the engine (simulator or Flower) of every run
    aggregation: Aggregation = Aggregation()  # FedAvg-LoRA's server rule: mean, a robust rule, or client-level DP

    @model_validator(mode="after")
    def _jsonl_split(self) -> Config:
        if self.data.source == "jsonl" and self.split.attribute not in JSONL_SPLITS:
            raise ValueError(f"split.attribute = {self.split.attribute!r}: a JSONL's pairs split by one of "
                             f"{', '.join(JSONL_SPLITS)}")
        return self
