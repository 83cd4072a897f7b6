"""The quickstart's config: data, client split, model and training sections."""

from __future__ import annotations

from typing import Literal

from collabalign.config import Strict


class DataConfig(Strict):
    source: Literal["hh-rlhf", "synthetic"] = "hh-rlhf"
    max_pairs: int | None = None  # the first N valid pairs of the file
    synthetic_pairs: int = 400
    test_fraction: float = 0.2
    max_length: int = 64  # tokens per prompt+reply text, truncated from the left (the reply is kept)


class SplitConfig(Strict):
    clients: int = 8
    attribute: str = "topic"  # a text attribute of each pair (HH-RLHF: keyword topic of the human turns)
    alpha: float = 0.5
    min_pairs: int = 16


class ModelConfig(Strict):
    backbone: str = "minilm-l6"
    lora_blocks: int = 1  # LoRA in the top N blocks; the blocks below run once, as cached features
    targets: list[str] = ["query", "value"]
    rank: int = 8
    alpha: float = 16.0


class TrainConfig(Strict):
    rounds: int = 10
    local_epochs: int = 1
    batch_size: int = 16
    lr: float = 1e-3  # a common LoRA default, fixed a priori and shared by all methods
    local_only_eval_every: int = 5  # each local-only evaluation costs one test pass per client


class Config(Strict):
    seeds: list[int] = [0]
    data: DataConfig = DataConfig()
    split: SplitConfig = SplitConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
