import numpy as np
import pytest
import torch

from collabalign.federation import simulate
from collabalign.methods.fedavg import FedAvg, LocalOnly
from collabalign.models.backbones import minilm_l6, tiny_llama
from collabalign.seeding import Seeds

from .reward_setup import reward_problem


@pytest.fixture(scope="module")
def tiny_problem():
    return reward_problem(tiny_llama(hidden_size=32, num_layers=2, num_heads=4), ["q_proj", "v_proj"])


def test_encoded_pairs_keep_chosen_and_rejected_aligned(tiny_problem):
    trainer, clients, train = tiny_problem
    sub = train[np.array([4, 1])]
    assert len(sub) == 2
    for row, pair in enumerate([4, 1]):
        assert torch.equal(sub.texts.tokens.input_ids[row], train.texts.tokens.input_ids[pair])
        assert torch.equal(sub.texts.tokens.input_ids[2 + row], train.texts.tokens.input_ids[len(train) + pair])
    tokens, features = train.batch(torch.tensor([0, 1, 2]))
    assert tokens.attention_mask[:, -1].any() and features.shape[:2] == tokens.input_ids.shape


def test_training_is_deterministic_and_starts_from_the_frozen_backbone(tiny_problem):
    trainer, clients, _ = tiny_problem
    start = trainer.initial_params(Seeds(0))
    assert all(not v.any() for k, v in start.items() if k.endswith(".B"))  # LoRA starts as a no-op
    runs = [trainer.train(start, clients["c0"], torch.Generator().manual_seed(5))[0] for _ in range(2)]
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in start)
    assert any(not np.array_equal(runs[0][k], start[k]) for k in start)


def test_local_only_reports_the_spread_over_clients(tiny_problem):
    trainer, clients, _ = tiny_problem
    result = simulate(LocalOnly(trainer), clients, rounds=1, seed=0, progress=False)
    final = result.metrics[-1]
    assert final["accuracy_min"] <= final["accuracy"] <= final["accuracy_max"]
    assert all(c.state for c in result.clients.values())


@pytest.mark.real
def test_fedavg_lora_learns_the_synthetic_preference_with_minilm():
    trainer, clients, _ = reward_problem(minilm_l6(), ["query", "value"], n_pairs=160, lr=3e-3, epochs=2)
    result = simulate(FedAvg(trainer), clients, rounds=3, seed=0, progress=False)
    assert result.metrics[0]["accuracy"] < 0.75
    assert result.metrics[-1]["accuracy"] > 0.9
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
