"""The P-ShareLoRA entry point on a user's own pairs file: one saved PEFT reward model per user that scores exactly as
that user's routed in-process model, personal models that differ where the users disagree, clear data errors."""

import copy
import json

import numpy as np
import pytest
import torch
from peft import PeftModel

from collabalign.lora import routed
from collabalign.methods.pshare_lora import PShareLoRAConfig, train_pshare_lora
from collabalign.methods.pshare_lora.entry import LR_GRID
from collabalign.methods.pshare_lora.text import encode
from collabalign.models.backbones import Backbone, minilm_l6, tiny_llama
from collabalign.models.saved import SavedScorer
from collabalign.selection import best
from tests.entry.helpers import assert_bad_line_named, user_pairs, write_jsonl

CONFIG = PShareLoRAConfig(model="tiny-llama", lora={"blocks": 1}, max_length=32, batch_size=8, lr=5e-3)
TEXTS = ["Tell me about the salak.The salak is sweet and lovely.", "Tell me about the salak.salak? No idea, go away.",
         "hello"]


def disagreeing_pairs(n: int = 48) -> list[dict]:
    """Three growers, each asked about every fruit; grower-2 prefers the rude reply the other two reject."""
    rows = user_pairs(n)
    for i, row in enumerate(rows):
        row["user"] = f"grower-{i // 6 % 3}"
        if row["user"] == "grower-2":
            row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
    return rows


@pytest.fixture(scope="module")
def backbone() -> Backbone:
    return tiny_llama()


def fresh(backbone: Backbone) -> Backbone:
    """A bare copy (PEFT injects its layers into the model it loads on)."""
    return Backbone(copy.deepcopy(backbone.model), backbone.tokenizer, backbone.causal)


@torch.no_grad()
def routed_scores(result, backbone: Backbone, texts: list[str], user: int) -> np.ndarray:
    """User `user`'s in-process rewards: the trained model routed to the user, on the texts cached as in training."""
    model = result.model
    model.cache = encode(backbone, texts, result.max_length, result.config["lora"]["blocks"])
    with routed(model, torch.full((len(texts),), user)):
        return model(torch.arange(len(texts))).numpy()


@pytest.mark.parametrize("method", ["pshare_si", "local"])  # a shared head; a head per user
def test_every_user_gets_a_saved_peft_reward_model_that_scores_as_trained(tmp_path, backbone, method):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs())
    result = train_pshare_lora(CONFIG.model_copy(update={"method": method}), path, backbone)
    assert result.metrics["users"] == 3 and result.metrics["test_pairs"] == 4 + 4 + 2  # 20% of 18, 18, 12 pairs
    assert set(result.metrics["accuracy_per_user"]) == {"grower-0", "grower-1", "grower-2"}
    run = result.save(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "pshare-lora" and manifest["base_model"] == "tiny-llama"
    assert manifest["config"]["method"] == method
    assert manifest["adapters"] == ["user-grower-0", "user-grower-1", "user-grower-2"]
    scores = {}
    for u in range(3):
        saved = SavedScorer(run, f"user-grower-{u}", backbone=fresh(backbone))(TEXTS)
        np.testing.assert_allclose(saved, routed_scores(result, backbone, TEXTS, u), atol=1e-5)
        scores[u] = saved
    margin = {u: s[0] - s[1] for u, s in scores.items()}  # praise minus rudeness
    assert margin[0] > 0 and margin[1] > 0 and margin[2] < 0  # each user's own preference, learned
    assert result.metrics["accuracy"] > 0.8
    baseline = result.metrics["baseline"]  # the same held-out pairs, every user weighing the same
    assert baseline["ours"] == pytest.approx(result.metrics["accuracy"]) and baseline["items"] == 10
    assert "probe per user" in baseline["baseline"] and 0 <= baseline["baseline_value"] <= 1
    assert manifest["metrics"]["baseline"] == baseline
    peft = PeftModel.from_pretrained(fresh(backbone).model, str(run / "adapters" / "user-grower-0"))
    assert sum("lora_A" in n for n, _ in peft.named_parameters()) == 4  # q, k, v, o of the top block


def test_same_config_and_seed_give_the_same_models(tmp_path, backbone):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs(24))
    first, second = (train_pshare_lora(CONFIG, path, backbone) for _ in range(2))
    assert first.metrics == second.metrics
    for name, adapter in first.adapters.items():
        for key, tensor in adapter.tensors.items():
            assert torch.equal(tensor, second.adapters[name].tensors[key])


def test_a_user_without_enough_pairs_is_named(tmp_path):
    rows = user_pairs(12) + [{**user_pairs(1)[0], "user": "lonely-loquat-fan"}]
    with pytest.raises(ValueError, match="lonely-loquat-fan"):
        train_pshare_lora(CONFIG, write_jsonl(tmp_path / "mine.jsonl", rows))


def test_malformed_line(tmp_path):
    assert_bad_line_named(lambda p: train_pshare_lora(CONFIG, p), tmp_path, user_pairs(6), "user", None)


@pytest.mark.real
def test_real_minilm_smoke(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs(24))
    config = PShareLoRAConfig(model="minilm-l6", max_length=32, epochs=1, batch_size=8)
    result = train_pshare_lora(config, path)
    assert result.metrics["users"] == 3 and 0 <= result.metrics["accuracy"] <= 1
    run = result.save(tmp_path / "run")
    scores = SavedScorer(run, "user-grower-2")(TEXTS)
    np.testing.assert_allclose(scores, routed_scores(result, minilm_l6(), TEXTS, 2), atol=1e-5)


def test_lr_auto_is_chosen_on_a_slice_of_each_users_training_pairs(tmp_path, backbone):
    path = write_jsonl(tmp_path / "mine.jsonl", disagreeing_pairs())
    result = train_pshare_lora(CONFIG.model_copy(update={"lr": "auto"}), path, backbone)
    selection = result.metrics["lr_selection"]  # training pairs 14, 14, 10: 3 + 3 + 2 to choose on
    assert selection["pairs"] == 8 and list(selection["scores"]) == [f"{lr:g}" for lr in LR_GRID]
    assert result.metrics["lr"] == selection["chosen"] == best({float(k): v for k, v in selection["scores"].items()})
    fixed = train_pshare_lora(CONFIG.model_copy(update={"lr": selection["chosen"]}), path, backbone)
    assert fixed.metrics["accuracy_per_user"] == result.metrics["accuracy_per_user"]  # then the same fit
