"""Federated fine-tuning: federated SFT and DPO of a LoRA policy over clients holding preference pairs, the gate
(learned at all, against the base model and centralised training) before FedAvg is ranked against the other server
optimisers under iid and Dirichlet splits, and quantised uploads against float32."""

from __future__ import annotations

from collabalign.experiments.fed_tune.comparison import comparison_part
from collabalign.experiments.fed_tune.config import Config
from collabalign.runs import RunDir

TITLE = "Federated SFT and DPO with server optimisers and quantised uploads"

__all__ = ["TITLE", "Config", "run"]


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    run_dir.write_parts([comparison_part(cfg, run_dir, progress)])
