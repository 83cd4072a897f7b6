import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign.artifacts import Result
from collabalign.lora import inject_lora
from collabalign.methods.meta_reward import MetaRewardConfig, train_meta_reward
from collabalign.methods.meta_reward.entry import fold_head, pooled_features
from collabalign.models.backbones import tiny_llama
from collabalign.models.pooled import PooledModel
from collabalign.models.saved import SavedScorer, base_prefix, pooled_adapter
from collabalign.models.text_reward import standardiser
from tests.entry.helpers import assert_bad_line_named, pooled_scores, write_jsonl

THINGS = {"teapots": ["kettle", "spout", "glaze"], "kites": ["tail", "spar", "string"],
          "lanterns": ["wick", "shade", "handle"]}
CONFIG = MetaRewardConfig(held_out="lanterns", model="tiny-llama", policy="tiny-llama", sft_steps=3, inner_steps=2,
                          outer_steps=4, select_every=2, test_steps=4, batch=4, outer_batch=4, max_length=32,
                          lora={"rank": 2, "alpha": 4.0})


def reviews(per_domain: int = 6) -> list[dict]:
    """Invented reviews: the chosen continuation praises the thing, the rejected one pans it."""
    rows = []
    for domain, parts in THINGS.items():
        for i in range(per_domain):
            part = parts[i % len(parts)]
            rows.append({"prompt": f"My {domain[:-1]} {part} ({i})", "chosen": f"is superb, I adore this {part}.",
                         "rejected": f"broke at once, a dreadful {part}.", "domain": domain})
    return rows


def test_meta_learns_a_reward_that_loads_through_peft(tmp_path):
    rows = reviews()
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    result = train_meta_reward(CONFIG, path)
    m = result.metrics
    assert m["train_domains"] == ["teapots", "kites"] and m["pairs"] == {"teapots": 6, "kites": 6, "lanterns": 6}
    assert 0 <= m["held_out_reward_accuracy"] <= 1 and set(m["held_out_apl"]) == {"sft", "meta_test"}
    assert len(m["log"]["loss"]) == 4
    run = result.save(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "meta-reward" and manifest["base_model"] == "tiny-llama"
    assert manifest["config"]["held_out"] == "lanterns" and len(manifest["data_hash"]) == 64
    backbone = tiny_llama()
    held = [r for r in rows if r["domain"] == "lanterns"]
    prompts = [r["prompt"] for r in held] * 2
    replies = [r["chosen"] for r in held] + [r["rejected"] for r in held]
    saved = SavedScorer(run, backbone=backbone)(prompts, replies)
    np.testing.assert_allclose(saved, pooled_scores(result.model, backbone.tokenizer, prompts, 32, replies)[:, 0],
                               atol=1e-5)
    right = (saved[:6] > saved[6:]) + 0.5 * (saved[:6] == saved[6:])  # a tie counts half
    assert np.mean(right) == m["held_out_reward_accuracy"]  # the metric is the saved reward's
    assert m["baseline"]["ours"] == m["held_out_reward_accuracy"] and m["baseline"]["items"] == 6
    assert "trained on the other domains" in m["baseline"]["baseline"]
    assert ("note" in m) == (m["selected_step"] == 0)  # keeping the initial reward is said, never silent
    arrays = load_file(str(run / "arrays.safetensors"))
    assert arrays["held_out_policy.lm_head.lora_A"].shape == (2, 64)
    assert arrays["held_out_policy.lm_head.lora_B"].shape == (len(backbone.tokenizer), 2)
    again = train_meta_reward(CONFIG, path)  # same config and seed: the same reward and policy
    np.testing.assert_array_equal(again.adapters["global"].head["weight"], result.adapters["global"].head["weight"])
    np.testing.assert_array_equal(again.arrays["held_out_policy.lm_head.lora_B"],
                                  arrays["held_out_policy.lm_head.lora_B"])


def test_unknown_held_out_domain_names_the_domains(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", reviews(2))
    with pytest.raises(ValueError, match=r"'attics': not a domain in the data.*\['teapots', 'kites', 'lanterns'\]"):
        train_meta_reward(CONFIG.model_copy(update={"held_out": "attics"}), path)


def test_malformed_line(tmp_path):
    assert_bad_line_named(lambda p: train_meta_reward(CONFIG, p), tmp_path, reviews(2), "domain", None)


@pytest.mark.real
def test_real_models_smoke(tmp_path):
    config = MetaRewardConfig(held_out="lanterns", sft_steps=2, inner_steps=2, outer_steps=2, select_every=2,
                              test_steps=2, batch=4, outer_batch=4, max_length=32)
    rows = reviews(4)
    result = train_meta_reward(config, write_jsonl(tmp_path / "mine.jsonl", rows))
    run = result.save(tmp_path / "run")
    prompts, replies = [r["prompt"] for r in rows[:3]], [r["chosen"] for r in rows[:3]]
    scorer = SavedScorer(run)
    np.testing.assert_allclose(scorer(prompts, replies), pooled_scores(result.model, scorer.tokenizer, prompts, 32,
                                                                       replies)[:, 0], atol=1e-5)


def test_the_saved_reward_folds_the_standardiser_into_its_head(tmp_path):
    """With a non-zero head (selection may keep the zero reward of step 0), the saved encoder + head gives exactly
    ((z - mean) / scale) . w + b on the raw pooled features z."""
    backbone = tiny_llama()
    reward = PooledModel(backbone.model, True, 1)
    inject_lora(reward.backbone, ["q_proj"], 1)
    prompts, replies = ["My kite tail", "My kite spar", "A wick"], ["is superb.", "broke at once.", "is fine."]
    raw = pooled_features(reward, backbone.tokenizer, prompts, replies, 32)
    mean, scale = standardiser(raw)
    w, b = np.random.default_rng(0).standard_normal(raw.shape[1]), 0.7
    fold_head(reward, w, b, mean, scale)
    result = Result("meta-reward", "reward", "tiny-llama", {}, "0" * 64, {},
                    {"global": pooled_adapter(reward, base_prefix(backbone.model), "tiny-llama")}, max_length=32)
    saved = SavedScorer(result.save(tmp_path / "run"), backbone=tiny_llama())(prompts, replies)
    np.testing.assert_allclose(saved, ((raw - mean) / scale) @ w + b, atol=1e-4)
    assert np.ptp(saved) > 0.1


def test_meta_training_starts_from_a_bradley_terry_reward_so_keeping_step_0_keeps_a_reward(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", reviews(12))
    kept = CONFIG.model_copy(update={"outer_steps": 2, "select_every": 2, "outer_lr": 1e-9})  # φ barely moves
    zero = train_meta_reward(kept.model_copy(update={"start": "zero"}), path).metrics
    bt = train_meta_reward(kept, path).metrics  # the default start
    assert zero["selected_step"] == 0 and zero["held_out_reward_accuracy"] == 0.5  # the zero reward: every pair ties
    assert "outer step 0: zero" in zero["note"]
    trained = [bt["reward_accuracy"][d] for d in ("teapots", "kites")]
    assert min(trained) > 0.9 and bt["reward_accuracy"] != zero["reward_accuracy"]  # the fit ranks its own domains
