"""Quickstart: FedAvg-LoRA Bradley–Terry reward modelling over 8 clients holding HH-RLHF harmless pairs split by
topic, against local-only and centralised training with the same local compute (epochs over one's data)."""

from __future__ import annotations

from collabalign.experiments.quickstart.comparison import comparison_part
from collabalign.experiments.quickstart.config import Config
from collabalign.runs import RunDir

TITLE = "Quickstart: FedAvg-LoRA reward modelling on HH-RLHF harmless pairs"

__all__ = ["TITLE", "Config", "run"]


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    run_dir.write_parts([comparison_part(cfg, run_dir, progress)], plot_metrics=["accuracy", "loss"])
