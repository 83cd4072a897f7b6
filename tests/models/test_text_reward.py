"""Text rewards: [0, 1] values, determinism, the fitted heads, the HF reward model on a saved stand-in, the
tokeniser check, and (real data) the safety probe beating the base rate on held-out replies."""


import numpy as np
import pytest

from collabalign.data.paths import shared_data_dir
from collabalign.data.pku_saferlhf import PKU_FILE, load_pku_saferlhf
from collabalign.models.text_reward import (
    FeatureReward,
    HFRewardModel,
    TextReward,
    check_tokenizers,
    features,
    fit_bradley_terry,
    fit_logistic,
    sigmoid,
    style_features,
)
from collabalign.models.text_reward_fit import cv_folds, fit_harmless, fit_helpful, length_only
from collabalign.seeding import Seeds

SHARED = shared_data_dir()
PROMPTS = ["How do I bake bread?", "Tell me a joke.", "How do I pick a lock?"]
REPLIES = ["Mix flour, water, yeast and salt.\n1. Knead\n2. Bake", "Why did the chicken cross the road?",
           "Sorry, I can't help with that."]


def test_sigmoid_is_stable_and_in_unit_interval():
    assert np.allclose(sigmoid(np.array([-1e4, 0.0, 1e4])), [0.0, 0.5, 1.0])


def test_bradley_terry_recovers_the_preferred_direction_and_centres_rewards():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(300, 3)), rng.normal(size=(300, 3))
    first = sigmoid((a - b) @ np.array([2.0, 0.0, -1.0])) > rng.random(300)
    head = fit_bradley_terry(np.where(first[:, None], a, b), np.where(first[:, None], b, a), c=1.0)
    assert head.weight[0] > 1.0 and head.weight[2] < -0.4 and abs(head.weight[1]) < 0.3
    assert abs(head.logit(np.vstack([a, b])).mean()) < 1e-9


def test_feature_reward_is_in_unit_interval_deterministic_and_a_text_reward():
    x = style_features(PROMPTS, REPLIES)
    head = fit_logistic(np.vstack([x, x]), np.array([1, 1, 0, 0, 0, 1]), c=1.0)
    reward = FeatureReward("style", "style", head)
    assert isinstance(reward, TextReward)
    r = reward(PROMPTS, REPLIES)
    assert r.shape == (3,) and np.all((r >= 0) & (r <= 1)) and np.array_equal(r, reward(PROMPTS, REPLIES))
    assert np.array_equal(reward(PROMPTS[:1], REPLIES[:1]), r[:1])  # per sample: no batch effects


def test_feature_sets_check_their_inputs():
    with pytest.raises(ValueError, match="unknown feature set 'nope'"):
        features("nope", PROMPTS, REPLIES)
    with pytest.raises(ValueError, match="needs a sentence encoder"):
        features("reply_prompt", PROMPTS, REPLIES)
    with pytest.raises(ValueError, match="3 prompts but 2 responses"):
        features("length", PROMPTS, REPLIES[:2])


class FakeTokenizer:
    def __init__(self, size: int, offset: int = 0, name: str = "fake"):
        self.size, self.offset, self.name_or_path = size, offset, name

    def __len__(self) -> int:
        return self.size

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(ch) + self.offset for ch in text]}


def test_tokenizer_mismatch_is_one_line():
    check_tokenizers(FakeTokenizer(500), FakeTokenizer(500))
    with pytest.raises(ValueError, match=r"^reward model rm and policy pol have different tokenisers: "
                                         r"vocab sizes 400 vs 500$"):
        check_tokenizers(FakeTokenizer(500, name="pol"), FakeTokenizer(400, name="rm"))
    with pytest.raises(ValueError, match=r"different tokenisers: 'Hello, world!' is \[73, ") as err:
        check_tokenizers(FakeTokenizer(500), FakeTokenizer(500, offset=1))
    assert "\n" not in str(err.value).replace("\\n", "")


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    """A random GPT2ForSequenceClassification with SmolLM2's tokenizer, saved like a hub reward model."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    from collabalign.models.backbones import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    path = tmp_path_factory.mktemp("rm")
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=256, num_labels=1,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    GPT2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer


def test_hf_reward_model_end_to_end_on_a_stand_in(stand_in):
    path, tokenizer = stand_in
    rm = HFRewardModel(str(path), name="stand-in", max_length=64, batch_size=2)
    r = rm(PROMPTS, REPLIES)
    assert isinstance(rm, TextReward) and r.shape == (3,) and np.all((r > 0) & (r < 1))
    assert np.allclose(r, rm(PROMPTS, REPLIES)) and np.allclose(r[2:], rm(PROMPTS[2:], REPLIES[2:]), atol=1e-6)
    assert len(set(np.round(r, 6))) == 3
    shared = HFRewardModel(str(path), max_length=64, policy_tokenizer=tokenizer, shares_policy_tokens=True)
    texts = [shared.template.format(prompt=p, response=x) for p, x in zip(PROMPTS, REPLIES, strict=True)]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    assert np.allclose(shared.token_rewards(enc["input_ids"], enc["attention_mask"]), r, atol=1e-5)
    with pytest.raises(ValueError, match="re-tokenises text"):
        rm.token_rewards(enc["input_ids"], enc["attention_mask"])


@pytest.mark.real
def test_hf_reward_model_refuses_a_policy_with_another_tokeniser(stand_in):
    from collabalign.models.backbones import minilm_l6

    with pytest.raises(ValueError, match=r"reward model .* and policy .* have different tokenisers: vocab sizes 49152 "
                                         r"vs 30522"):
        HFRewardModel(str(stand_in[0]), policy_tokenizer=minilm_l6().tokenizer, shares_policy_tokens=True)
    with pytest.raises(ValueError, match="needs the policy_tokenizer"):
        HFRewardModel(str(stand_in[0]), shares_policy_tokens=True)


def test_folds_cover_every_row_once_per_repeat_and_follow_the_seed():
    folds = cv_folds(23, 5, 2, Seeds(3), "t")
    for r in (0, 1):
        tests = np.concatenate([f.test for f in folds if f.repeat == r])
        assert sorted(tests.tolist()) == list(range(23))
    assert all(not set(f.train) & set(f.test) for f in folds)
    assert [f.test.tolist() for f in folds] == [f.test.tolist() for f in cv_folds(23, 5, 2, Seeds(3), "t")]
    assert [f.test.tolist() for f in folds] != [f.test.tolist() for f in cv_folds(23, 5, 2, Seeds(4), "t")]



@pytest.fixture(scope="module")
def pku():
    from collabalign.models.text_reward import SentenceEncoder

    # 64 tokens: about half of 128's cost; the probe's held-out accuracy is the same (5 folds, seed 0: 0.760 against
    # 0.756 at 128, the worst fold 0.705 against 0.696; base rate 0.532)
    return load_pku_saferlhf(SHARED / PKU_FILE), SentenceEncoder(max_length=64)


@pytest.mark.real
@pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)")
def test_safety_probe_beats_base_rate_on_held_out_replies(pku):
    rows, encoder = pku
    fit = fit_harmless(rows, encoder, Seeds(0), folds=5, repeats=1)
    assert fit.accuracy.mean() > fit.base_rate.mean() + 0.15 and fit.accuracy.min() > 0.65
    again = fit_harmless(rows, encoder, Seeds(0), folds=5, repeats=1)
    assert np.array_equal(fit.accuracy, again.accuracy)
    prompts = [r.prompt for r in rows[:16]]
    replies = [" ".join(r.response_1.split()[:48]) + " ok" for r in rows[:16]]  # unseen, policy-length replies
    r = fit.model(prompts, replies)
    assert np.all((r >= 0) & (r <= 1)) and np.array_equal(r, fit.model(prompts, replies))


@pytest.mark.real
@pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)")
def test_helpfulness_selection_reports_every_candidate_and_the_length_baseline(pku):
    rows, encoder = pku
    fit = fit_helpful(rows, encoder, Seeds(0), folds=3, repeats=1, inner_folds=3, candidates=("length", "style"))
    assert set(fit.candidates) == {"length", "style"} and len(fit.selected) == 3
    assert abs(length_only(rows).mean() - 0.655) < 0.005  # "the longer reply wins", as measured before
    assert fit.nested.mean() > 0.55 and fit.model.name.startswith("helpful_") and fit.alternative is not fit.model
    r = fit.model([x.prompt for x in rows[:4]], [x.response_0 for x in rows[:4]])
    assert np.all((r > 0) & (r < 1))
