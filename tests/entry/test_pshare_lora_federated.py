"""Federated P-ShareLoRA on a user's own pairs file (one client per user): each user's saved PEFT reward model scores
exactly as its in-process model, personal models that differ where the users disagree, the config's aggregation rule
applied to the shared parameters, and dropout refused (its draws would differ between engines)."""

import numpy as np
import pytest
import torch

from collabalign.config import ConfigError, validate
from collabalign.methods.pshare_lora.federated_entry import (
    FederatedPShareLoRAConfig,
    pshare_lora_federated_job,
    train_pshare_lora_federated,
)
from collabalign.methods.pshare_lora.text import encode
from collabalign.models.backbones import tiny_llama
from collabalign.models.saved import SavedScorer
from tests.entry.helpers import write_jsonl
from tests.entry.test_pshare_lora import TEXTS, disagreeing_pairs, fresh

CONFIG = FederatedPShareLoRAConfig(model="tiny-llama", lora={"blocks": 1}, max_length=32, batch_size=8, lr=5e-3,
                                   rounds=6, local_steps=10)


@pytest.fixture(scope="module")
def backbone():
    return tiny_llama()


def test_each_users_saved_model_scores_as_its_in_process_model(tmp_path, backbone):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs())
    job = pshare_lora_federated_job(CONFIG, path, backbone)
    sim = job.simulate()
    for cid, client in sim.clients.items():
        own = job.personal(sim.state, client)
        name = client.data["name"]
        own.model.cache = encode(backbone, TEXTS, CONFIG.max_length, 1)
        with torch.no_grad():
            in_process = own.model(torch.arange(len(TEXTS))).numpy()
        saved = SavedScorer(own.save(tmp_path / cid), f"user-{name}", backbone=fresh(backbone))(TEXTS)
        np.testing.assert_allclose(saved, in_process, atol=1e-5)


def test_personal_models_learn_each_users_own_preference(tmp_path, backbone):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs())
    result = train_pshare_lora_federated(CONFIG.model_copy(update={"method": "local"}), path, backbone)
    run = result.save(tmp_path / "run")
    assert sorted(result.adapters) == ["user-grower-0", "user-grower-1", "user-grower-2"]
    margin = {}
    for u in range(3):
        scores = SavedScorer(run, f"user-grower-{u}", backbone=fresh(backbone))(TEXTS)
        margin[u] = scores[0] - scores[1]  # praise minus rudeness
    assert margin[0] > 0 and margin[1] > 0 and margin[2] < 0, margin
    assert result.metrics["accuracy"] > 0.8
    assert result.metrics["baseline"]["ours"] == pytest.approx(result.metrics["accuracy"])  # users weigh the same


def test_the_aggregation_rule_combines_the_shared_parameters(tmp_path, backbone):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs(24))
    one_round = CONFIG.model_copy(update={"rounds": 1})
    shared = {}
    for rule in ("mean", "median"):
        config = validate(FederatedPShareLoRAConfig, one_round.model_dump() | {"aggregation": {"rule": rule}}, "test")
        job = pshare_lora_federated_job(config, path, backbone)
        shared[rule] = job.simulate().state["params"]
    b = next(n for n in shared["mean"] if n.endswith(".B"))
    assert not np.allclose(shared["mean"][b], shared["median"][b])


def test_dropout_is_refused_with_its_reason():
    with pytest.raises(ConfigError, match="lora.*without LoRA dropout"):
        validate(FederatedPShareLoRAConfig, {"lora": {"dropout": 0.1}}, "job.yaml")
