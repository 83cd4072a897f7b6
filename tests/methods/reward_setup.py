"""A small FedAvg-LoRA reward-modelling problem: synthetic polite-vs-rude pairs, a reward model with LoRA in the
top block, cached features, and clients split by topic."""

import numpy as np
import torch

from collabalign.data import dirichlet, tiny_preferences
from collabalign.methods.reward_trainer import RewardTrainer, encode_pairs
from collabalign.models.cached import lora_top_blocks
from collabalign.models.reward import RewardModel


def reward_problem(backbone, targets, n_pairs=120, n_clients=3, lr=1e-3, epochs=1, n_blocks=1):
    """(trainer, {client id: EncodedPairs}, all training pairs encoded)."""
    pairs = tiny_preferences(n_pairs, np.random.default_rng(0)).pairs
    model = RewardModel(backbone.model, backbone.causal)
    split = lora_top_blocks(model, n_blocks, targets, rank=4)
    encoded = encode_pairs(model, backbone.tokenizer, pairs, 32, split)
    n_test = n_pairs // 4
    test, train = encoded[torch.arange(n_test)], encoded[torch.arange(n_test, n_pairs)]
    topics = [p.attributes["topic"] for p in pairs[n_test:]]
    parts = dirichlet(topics, n_clients, 1.0, np.random.default_rng(1), min_size=8)
    trainer = RewardTrainer(model, test, lr=lr, epochs=epochs, batch_size=8)
    return trainer, {f"c{i}": train[p] for i, p in enumerate(parts)}, train
