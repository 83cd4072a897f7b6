"""Quickstart: FedAvg-LoRA Bradley–Terry reward modelling over 8 clients holding HH-RLHF harmless pairs split
by topic, against local-only and centralised training with the same local compute (epochs over one's data)."""

from __future__ import annotations

import sys
import time
from typing import Literal

import numpy as np
import torch

from collabalign.config import Strict
from collabalign.data import PreferenceSet, dirichlet, label_skew, load_hh_rlhf, shared_data_dir, tiny_preferences
from collabalign.federation import simulate
from collabalign.lora.inject import inject_lora
from collabalign.methods.fedavg import FedAvg, LocalOnly
from collabalign.methods.reward_trainer import RewardTrainer, encode_pairs
from collabalign.models.backbones import load_backbone
from collabalign.models.pooled import layer_stack, top_block_targets
from collabalign.models.reward import RewardModel
from collabalign.runs import RunDir, claim
from collabalign.seeding import Seeds

TITLE = "Quickstart: FedAvg-LoRA reward modelling on HH-RLHF harmless pairs"
HH_FILE = ("hh-rlhf", "harmless-base-test.jsonl.gz")


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


def load_pairs(cfg: DataConfig, notes: list[str]) -> PreferenceSet:
    """HH-RLHF harmless pairs from the shared data (invalid rows dropped and counted), or the synthetic set."""
    root = shared_data_dir()
    if cfg.source == "hh-rlhf" and root is not None and root.joinpath(*HH_FILE).exists():
        data = load_hh_rlhf(root.joinpath(*HH_FILE), drop_invalid=True)
        notes.append(f"Data: {len(data)} valid pairs from {'/'.join(HH_FILE)}; dropped rows: {data.dropped or 'none'}.")
    else:
        if cfg.source == "hh-rlhf":
            msg = "shared HH-RLHF data not found (../shared/data or $COLLABALIGN_DATA): running on synthetic pairs"
            print(f"quickstart: {msg}", file=sys.stderr)
            notes.append(f"**Fallback:** {msg}; numbers below are not HH-RLHF results.")
        data = tiny_preferences(cfg.synthetic_pairs, Seeds(0).numpy("synthetic-data"))
        notes.append(f"Data: {len(data)} synthetic polite-vs-rude pairs (tiny_preferences).")
    if cfg.max_pairs is not None:
        data = PreferenceSet(data.pairs[: cfg.max_pairs], data.dropped, data.source)
    return data


def correct(trainer: RewardTrainer, params) -> torch.Tensor:
    """Per held-out pair: 1 if ranked right, 0.5 on a tie, 0 if wrong."""
    chosen, rejected = trainer.test_rewards(params)
    return (chosen > rejected).double() + 0.5 * (chosen == rejected).double()


def paired(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Mean of a - b over the same test pairs and its standard error, in accuracy points."""
    d = (a - b) * 100
    return float(d.mean()), float(d.std() / len(d) ** 0.5)


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    notes: list[str] = []
    pairs = load_pairs(cfg.data, notes)
    backbone = load_backbone(cfg.model.backbone)
    model = RewardModel(backbone.model, backbone.causal)
    inject_lora(model.backbone, top_block_targets(model.backbone, cfg.model.lora_blocks, cfg.model.targets),
                cfg.model.rank, cfg.model.alpha)
    split = len(layer_stack(model.backbone)[1]) - cfg.model.lora_blocks
    t0 = time.perf_counter()
    if progress:
        print(f"quickstart: running {2 * len(pairs)} texts through the {split} frozen blocks once", file=sys.stderr)
    encoded = encode_pairs(model, backbone.tokenizer, pairs.pairs, cfg.data.max_length, split)
    feature_s = time.perf_counter() - t0
    labels = np.array([str(p.attributes.get(cfg.split.attribute)) for p in pairs])
    shorter = np.array([len(p.chosen) < len(p.rejected) for p in pairs])  # a length heuristic as reference
    records, finals, ledgers, times, data_info = [], {}, {}, {}, []
    for seed in cfg.seeds:
        perm = Seeds(seed).numpy("test-split").permutation(len(pairs))
        n_test = int(round(cfg.data.test_fraction * len(pairs)))
        test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        parts = dirichlet(labels[train_idx], cfg.split.clients, cfg.split.alpha, Seeds(seed).numpy("partition"),
                          cfg.split.min_pairs)
        clients = {f"client{i}": encoded[train_idx[p]] for i, p in enumerate(parts)}
        data_info.append({"seed": seed, "train_pairs": len(train_idx), "test_pairs": n_test,
                          "client_pairs": [len(p) for p in parts],
                          "label_skew_tv": round(label_skew(parts, labels[train_idx]), 4),
                          "shorter_reply_accuracy": float(shorter[test_idx].mean())})
        trainer = RewardTrainer(model, split, encoded[test_idx], cfg.train.lr, cfg.train.local_epochs,
                                cfg.train.batch_size)
        runs = {"fedavg-lora": (FedAvg(trainer), clients, 1),
                "local-only": (LocalOnly(trainer), clients, cfg.train.local_only_eval_every),
                "centralised": (FedAvg(trainer), {"central": encoded[train_idx]}, 1)}
        for method, (algorithm, data, every) in runs.items():
            start = time.perf_counter()
            result = simulate(algorithm, data, cfg.train.rounds, seed, eval_every=every, progress=progress,
                              label=f"{method} seed {seed}")
            times[f"{method}/seed{seed}"] = round(time.perf_counter() - start, 2)
            records += [{"method": method, "seed": seed, **r} for r in result.metrics]
            if method == "local-only":  # per test pair: the mean over clients of their own models' correctness
                finals[method, seed] = torch.stack([correct(trainer, c.state) for c in result.clients.values()]).mean(0)
            else:
                finals[method, seed] = correct(trainer, result.state)
            if seed == cfg.seeds[0] and method != "centralised":
                ledgers[method] = result.ledger
    run_dir.write_metrics(records)
    run_dir.write_ledgers(ledgers)
    claims, metrics = evaluate_claims(cfg, finals), {}
    metrics["final_accuracy"] = {m: round(float(np.mean([finals[m, s].mean() for s in cfg.seeds])), 4)
                                 for m in ("fedavg-lora", "local-only", "centralised")}
    metrics["data"] = {"source": pairs.source, "pairs": len(pairs), "dropped": pairs.dropped,
                       "attribute": cfg.split.attribute, "alpha": cfg.split.alpha, "per_seed": data_info}
    metrics["bytes_per_round_fedavg"] = ledgers["fedavg-lora"].total() // cfg.train.rounds
    metrics["seconds"] = {"features": round(feature_s, 2), **times}
    notes.append(f"Clients: {cfg.split.clients}, Dirichlet(alpha={cfg.split.alpha}) over the `{cfg.split.attribute}` "
                 f"attribute; {cfg.model.backbone} with rank-{cfg.model.rank} LoRA on {cfg.model.targets} of the top "
                 f"{cfg.model.lora_blocks} block(s); {cfg.train.rounds} rounds x {cfg.train.local_epochs} local "
                 f"epoch(s); centralised trains the same epochs on all training pairs.")
    run_dir.write_summary(claims, metrics, notes=notes, plot_metrics=["accuracy", "loss"])


def evaluate_claims(cfg: Config, finals: dict) -> list[dict]:
    """Both claims from paired per-test-pair differences, averaged over seeds; the verdict is inconclusive when
    the threshold lies within 1.96 standard errors of the measured difference."""
    def diff(a: str, b: str) -> tuple[float, float]:
        stats = [paired(finals[a, s], finals[b, s]) for s in cfg.seeds]
        return (float(np.mean([m for m, _ in stats])),
                float(np.sqrt(np.sum([se**2 for _, se in stats])) / len(stats)))

    gain, gain_se = diff("fedavg-lora", "local-only")
    gap, gap_se = diff("centralised", "fedavg-lora")
    beats = "reproduced" if gain > 1.96 * gain_se else "not reproduced" if gain <= 0 else "inconclusive"
    within = ("reproduced" if gap + 1.96 * gap_se <= 3 else "not reproduced" if gap - 1.96 * gap_se > 3
              else "inconclusive")
    seeds = len(cfg.seeds)
    return [
        claim("FedAvg-LoRA beats local-only", beats,
              {"gain_points": round(gain, 2), "se": round(gain_se, 2), "seeds": seeds},
              "final held-out accuracy of FedAvg-LoRA above the mean of the clients' local-only models"),
        claim("FedAvg-LoRA is within 3 points of centralised", within,
              {"gap_points": round(gap, 2), "se": round(gap_se, 2), "seeds": seeds},
              "centralised accuracy minus FedAvg-LoRA accuracy <= 3 points"),
    ]
