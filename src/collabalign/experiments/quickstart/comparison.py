"""The quickstart's one part: FedAvg-LoRA Bradley–Terry reward modelling over clients holding preference pairs
(HH-RLHF harmless pairs split by topic, or the user's JSONL split by user or domain), against local-only and
centralised training with the same local compute."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from collabalign.claims import non_inferiority, superiority
from collabalign.data import PreferenceSet, dirichlet, label_skew
from collabalign.data.errors import DataError
from collabalign.experiments.quickstart.config import Config, DataConfig, TrainConfig
from collabalign.experiments.quickstart.data import preference_data, split_labels
from collabalign.federation import simulate
from collabalign.federation.aggregation import Aggregation, privacy_spent
from collabalign.methods.fedavg import FedAvg, LocalOnly
from collabalign.methods.reward_trainer import EncodedPairs, RewardTrainer, encode_pairs
from collabalign.models.backbones import load_backbone
from collabalign.models.cached import lora_top_blocks
from collabalign.models.reward import RewardModel, pair_correct
from collabalign.models.saved import base_prefix, pooled_adapter
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

BEATS_LOCAL = superiority(
    "FedAvg-LoRA beats local-only", "final held-out accuracy (points) of FedAvg-LoRA above the mean over clients of "
    "their local-only models', paired over seeds")
NEAR_CENTRAL = non_inferiority(
    "FedAvg-LoRA is within 3 points of centralised", "FedAvg-LoRA's final held-out accuracy at most 3 points below "
    "centralised training's on the same pairs (one-sided), paired over seeds", margin=3.0)


@dataclass
class Setup:
    """What every seed shares: the pairs, the labels the clients are split by, the LoRA reward model and tokenizer."""

    pairs: PreferenceSet
    labels: np.ndarray
    model: RewardModel
    tokenizer: Any
    split: int  # blocks below the LoRA blocks, run once as cached features
    prefix: str  # where the LoRA layers sit in the base model a PEFT user loads (`models.saved.base_prefix`)

    def encode(self, cfg: DataConfig, rows: Sequence[int] | None = None) -> EncodedPairs:
        """The pairs `rows` (default: all) tokenised and run through the frozen blocks, in one encoding."""
        pairs = self.pairs.pairs if rows is None else [self.pairs.pairs[i] for i in rows]
        return encode_pairs(self.model, self.tokenizer, pairs, max_length=cfg.max_length, split=self.split)


def prepare(cfg: Config, notes: list[str]) -> Setup:
    """The pairs and their split labels (a bad attribute name fails here, before any work), and the model."""
    pairs = preference_data(cfg, notes)
    labels = split_labels(pairs, cfg.split.attribute)
    backbone = load_backbone(cfg.model.backbone)
    model = RewardModel(backbone.model, backbone.causal)
    model_cfg = cfg.model
    split = lora_top_blocks(model, model_cfg.lora_blocks, targets=model_cfg.targets, rank=model_cfg.rank,
                            alpha=model_cfg.alpha)
    return Setup(pairs, labels, model.to(model_cfg.device), backbone.tokenizer, split, base_prefix(backbone.model))


def seed_split(cfg: Config, labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The seed's held-out pairs, its training pairs, and each client's share of the training pairs by client id
    (positions in the training pairs), Dirichlet over the labels."""
    perm = Seeds(seed).numpy("test-split").permutation(len(labels))
    n_test = int(round(cfg.data.test_fraction * len(labels)))
    if not 0 < n_test < len(labels):
        raise DataError("data", None, None, f"{len(labels)} pairs leave {n_test} for testing at data.test_fraction = "
                        f"{cfg.data.test_fraction}; add pairs or change the fraction")
    test_idx, train_idx = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    split = cfg.split
    parts = dirichlet(labels[train_idx], split.clients, split.alpha, rng=Seeds(seed).numpy("partition"),
                      min_size=split.min_pairs)
    return test_idx, train_idx, dict(zip(client_ids(cfg), parts, strict=True))


def client_ids(cfg: Config) -> list[str]:
    """The clients' ids; a deployed node with partition id i runs the i-th."""
    return [f"client{i}" for i in range(cfg.split.clients)]


def reward_trainer(train: TrainConfig, setup: Setup, test: EncodedPairs) -> RewardTrainer:
    """The Bradley–Terry trainer every method shares, scoring the held-out pairs `test`."""
    return RewardTrainer(setup.model, test, lr=train.lr, epochs=train.local_epochs, batch_size=train.batch_size)




def federated_job(cfg: Config, seed: int) -> tuple[FedAvg, dict[str, EncodedPairs]]:
    """FedAvg-LoRA of `seed` as `comparison_part` builds it (benchmarks/engine_many.py times it): the algorithm (its
    trainer scores the held-out pairs) and the clients' encoded pairs."""
    setup = prepare(cfg, [])
    test_idx, train_idx, shares = seed_split(cfg, setup.labels, seed)
    encoded = setup.encode(cfg.data)
    test, clients = encoded[test_idx], {c: encoded[train_idx[p]] for c, p in shares.items()}
    return FedAvg(reward_trainer(cfg.train, setup, test), server_rule(cfg.aggregation, seed)), clients

def comparison_part(cfg: Config, run_dir: RunDir, progress: bool = True) -> Part:
    """FedAvg-LoRA, local-only and centralised over the seeds; writes the ledgers, returns the part."""
    notes: list[str] = []
    setup = prepare(cfg, notes)
    pairs, labels = setup.pairs, setup.labels
    t0 = time.perf_counter()
    if progress:
        print(f"quickstart: running {2 * len(pairs)} texts through the {setup.split} frozen blocks once",
              file=sys.stderr)
    encoded = setup.encode(cfg.data)
    feature_s = time.perf_counter() - t0
    shorter = np.array([len(p.chosen) < len(p.rejected) for p in pairs])  # a length heuristic as reference
    records, finals, ledgers, times, data_info = [], {}, {}, {}, []
    for seed in cfg.seeds:
        test_idx, train_idx, shares = seed_split(cfg, labels, seed)
        n_test, parts = len(test_idx), list(shares.values())
        clients = {c: encoded[train_idx[p]] for c, p in shares.items()}
        data_info.append({"seed": seed, "train_pairs": len(train_idx), "test_pairs": n_test,
                          "client_pairs": [len(p) for p in parts],
                          "label_skew_tv": round(label_skew(parts, labels[train_idx]), 4),
                          "shorter_reply_accuracy": float(shorter[test_idx].mean())})
        trainer = reward_trainer(cfg.train, setup, encoded[test_idx])
        runs = {"fedavg-lora": (FedAvg(trainer, server_rule(cfg.aggregation, seed)), clients, 1),
                "local-only": (LocalOnly(trainer), clients, cfg.train.local_only_eval_every),
                "centralised": (FedAvg(trainer), {"central": encoded[train_idx]}, 1)}
        for method, (algorithm, data, every) in runs.items():
            start = time.perf_counter()
            result = simulate(algorithm, data, cfg.train.rounds, seed, eval_every=every, options=cfg.engine,
                              progress=progress, label=f"{method} seed {seed}")
            times[f"{method}/seed{seed}"] = round(time.perf_counter() - start, 2)
            records += [{"method": method, "seed": seed, **r} for r in result.metrics]
            if method == "local-only":  # the mean over clients of their own models' accuracy, evaluated where the
                finals[method, seed] = torch.tensor(result.metrics[-1]["accuracy"])  # models live (also on Flower)
            else:
                finals[method, seed] = pair_correct(*trainer.test_rewards(result.state))
                trainer.load(result.state)  # the global model, saved as a PEFT folder with its score head
                pooled_adapter(setup.model, setup.prefix, cfg.model.backbone).save(
                    run_dir.path / "adapters" / f"{method}-seed{seed}")
            if seed == cfg.seeds[0] and method != "centralised":
                ledgers[method] = result.ledger
    run_dir.write_ledgers(ledgers)
    metrics = {}
    metrics["final_accuracy"] = {m: round(float(np.mean([finals[m, s].mean() for s in cfg.seeds])), 4)
                                 for m in ("fedavg-lora", "local-only", "centralised")}
    metrics["data"] = {"source": pairs.source, "pairs": len(pairs), "dropped": pairs.dropped,
                       "attribute": cfg.split.attribute, "alpha": cfg.split.alpha, "per_seed": data_info}
    metrics["bytes_per_round_fedavg"] = ledgers["fedavg-lora"].total() // cfg.train.rounds
    if cfg.aggregation.privacy is not None:  # every client takes part in every round
        dp = cfg.aggregation.privacy
        epsilon = privacy_spent(dp, n_clients=cfg.split.clients, per_round=cfg.split.clients, rounds=cfg.train.rounds)
        metrics["privacy"] = {"epsilon": epsilon, "delta": dp.delta}
    metrics["seconds"] = {"features": round(feature_s, 2), **times}
    notes.append(f"Clients: {cfg.split.clients}, Dirichlet(alpha={cfg.split.alpha}) over the `{cfg.split.attribute}` "
                 f"attribute; {cfg.model.backbone} with rank-{cfg.model.rank} LoRA on {cfg.model.targets} of the top "
                 f"{cfg.model.lora_blocks} block(s); {cfg.train.rounds} rounds x {cfg.train.local_epochs} local "
                 f"epoch(s); centralised trains the same epochs on all training pairs.")
    return Part(decide_claims(cfg, finals), records, metrics, notes)


def server_rule(aggregation: Aggregation, seed: int) -> Aggregation:
    """FedAvg-LoRA's server rule for one seed: with DP, the noise stream is drawn from that seed."""
    if aggregation.privacy is None:
        return aggregation
    noise = aggregation.privacy.model_copy(update={"seed": Seeds(seed).entropy("dp-noise")})
    return aggregation.model_copy(update={"privacy": noise})


def accuracy_points(finals: dict, method: str, seeds: list[int]) -> np.ndarray:
    """Per seed: the method's final held-out accuracy in points."""
    return np.array([100 * float(finals[method, s].mean()) for s in seeds])


def decide_claims(cfg: Config, finals: dict) -> list[dict]:
    """Both claims on per-seed accuracies, paired by seed (the seed draws the test split, the clients' split and
    the initialisation)."""
    fed, local, central = (accuracy_points(finals, m, cfg.seeds) for m in ("fedavg-lora", "local-only", "centralised"))
    means = {"fedavg_lora": fed.mean(), "local_only": local.mean(), "centralised": central.mean()}
    return [BEATS_LOCAL.decide(fed, local, mean_points=means), NEAR_CENTRAL.decide(fed, central, mean_points=means)]
