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
def test_fedavg_lora_samples_its_clients_and_each_message_carries_the_whole_adapter(tiny_problem):
    """(On Flower's engines the same job is checked against this run: tests/federation/test_deployment.py on a
    deployment, the Ray simulation with P-ShareLoRA in tests/methods/pshare_lora/test_federated.py.)"""
    trainer, clients, _ = tiny_problem
    result = simulate(FedAvg(trainer), clients, rounds=3, seed=11, fraction=2 / 3, progress=False)
    assert [m["round"] for m in result.metrics] == [0, 1, 2, 3]
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]
    assert len(result.ledger.rows) == 3 * 2 * 2  # 2 of 3 clients sampled per round, one message each way
    lora_bytes = sum(v.nbytes for v in result.state.values())
    assert all(b > lora_bytes for *_, b in result.ledger.rows)  # the whole adapter and head, each way


def test_fedavg_lora_learns_the_synthetic_preference_with_minilm():
    trainer, clients, _ = reward_problem(minilm_l6(), ["query", "value"], n_pairs=160, lr=3e-3, epochs=2)
    result = simulate(FedAvg(trainer), clients, rounds=3, seed=0, progress=False)
    assert result.metrics[0]["accuracy"] < 0.75
    assert result.metrics[-1]["accuracy"] > 0.9
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]


def test_train_many_equals_one_client_after_another_in_float64():
    """Clients of 16, 13 and 5 pairs (batch 8): the first two train as one group of two steps per epoch, routed by
    row index (their last batches differ), the third alone; B != 0 so every factor's gradient is live."""
    backbone = tiny_llama(hidden_size=32, num_layers=2, num_heads=4)
    backbone.model.double()
    trainer, _, train = reward_problem(backbone, ["q_proj", "v_proj"], epochs=2)
    trainer.model.double()  # the head and LoRA factors too
    rng = np.random.default_rng(0)
    start = trainer.initial_params(Seeds(0))
    params = [{k: v + 0.05 * rng.standard_normal(v.shape) for k, v in start.items()} for _ in range(3)]
    data = [train[torch.arange(a, b)] for a, b in ((0, 16), (16, 29), (29, 34))]
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]  # noqa: E731
    sequential = [trainer.train(p, d, g) for p, d, g in zip(params, data, gens(), strict=True)]
    many = trainer.train_many(params, data, gens())
    assert [n for _, n in many] == [16, 13, 5]
    assert max(float(np.abs(a[k] - b[k]).max()) for (a, _), (b, _) in zip(many, sequential, strict=True)
               for k in a) < 1e-10
    assert all(list(a) == list(b) for (a, _), (b, _) in zip(many, sequential, strict=True))
    assert max(float(np.abs(a[k] - p[k]).max()) for (a, _), p in zip(many, params, strict=True) for k in a) > 1e-4
    trainer.max_rows = 8  # one client per computation
    alone = trainer.train_many(params, data, gens())
    assert max(float(np.abs(a[k] - b[k]).max()) for (a, _), (b, _) in zip(alone, many, strict=True) for k in a) < 1e-10


@pytest.mark.parametrize("algorithm", [FedAvg, LocalOnly])
def test_fedavg_lora_and_local_only_with_the_batched_hook_equal_the_sequential_run(tiny_problem, algorithm):
    from collabalign.federation.engine import EngineOptions

    trainer, clients, _ = tiny_problem
    runs = [simulate(algorithm(trainer), clients, rounds=2, seed=0, progress=False,
                     options=EngineOptions(batched=batched)) for batched in (True, False)]
    for cid, client in runs[0].clients.items():  # local-only's own models (FedAvg keeps none)
        assert client.state.keys() == runs[1].clients[cid].state.keys()
        assert all(k == "head.bias" or np.allclose(v, runs[1].clients[cid].state[k], atol=1e-5)
                   for k, v in client.state.items())
    for key, value in runs[0].state.items():  # the head's bias cancels in the BT loss: AdamW steps its rounding noise
        assert key == "head.bias" or np.allclose(value, runs[1].state[key], atol=1e-5), key
    assert [m["accuracy"] for m in runs[0].metrics] == pytest.approx([m["accuracy"] for m in runs[1].metrics])
