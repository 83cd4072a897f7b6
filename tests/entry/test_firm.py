import json

import numpy as np
import pytest
import torch
from peft import PeftModel

from collabalign.methods.firm import FIRMConfig, train_firm
from collabalign.models.backbones import tiny_llama
from collabalign.policy.model import positions
from collabalign.policy.saved import saved_policy
from tests.entry.helpers import FRUIT, assert_bad_line_named, write_jsonl

CONFIG = FIRMConfig(model="tiny-llama", clients=2, rounds=2, batch_size=4, max_new_tokens=4, test_fraction=0.25,
                    lora=dict(rank=4, alpha=8.0), ppo=dict(minibatch=2, actor_lr=1e-2), preference=[1.5, 0.5])


def prompts(n: int = 8) -> list[dict]:
    return [{"prompt": f"Which orchard grows the {FRUIT[i % len(FRUIT)]} (plot {i})?"} for i in range(n)]


def mentions_fruit(prompts: list[str], replies: list[str]) -> list[float]:
    return [float(any(f in r for f in FRUIT)) + 0.1 * len(r) / (1 + len(r)) for r in replies]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("firm")
    result = train_firm(CONFIG, write_jsonl(tmp / "mine.jsonl", prompts()), rewards=[mentions_fruit, "brevity"])
    return result, result.save(tmp / "run")


def test_trains_on_a_users_prompts_with_a_callable_and_a_shipped_reward(run):
    result, path = run
    m = result.metrics
    assert m["objectives"] == ["mentions_fruit", "brevity"] and (m["clients"], m["test_prompts"]) == (2, 2)
    assert [r["round"] for r in m["rounds"]] == [0, 1, 2]
    assert {"lambda_0", "lambda_1", "train_reward_0", "train_reward_1"} <= set(m["rounds"][-1])
    assert 0 <= m["eval_reward_1"] <= 1
    baseline = m["baseline"]  # the base policy (adapter off) on the same held-out prompts and generator
    assert baseline["items"] == 2 and set(baseline["per_objective"]) == {"mentions_fruit", "brevity"}
    assert baseline["metric"] == "preference-weighted reward"
    weighted = 0.75 * baseline["per_objective"]["mentions_fruit"]["ours"] + 0.25 * baseline["per_objective"][
        "brevity"]["ours"]  # the preference [1.5, 0.5], normalised
    assert baseline["ours"] == pytest.approx(weighted, abs=1e-5)
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["method"], manifest["kind"], manifest["adapters"]) == ("firm", "policy", ["policy"])
    assert manifest["config"]["preference"] == [1.5, 0.5] and len(manifest["data_hash"]) == 64
    assert any(np.abs(v).max() > 0 for k, v in result.model.adapter_state().items() if k.endswith(".B"))


def test_peft_log_probs_and_saved_policy_match_the_trained_policy(run):
    result, path = run
    policy = result.model
    rollout = policy.rollout(["Which orchard grows the salak?"], ["The north one, by the loquat trees."])
    expected = policy.token_logprobs(rollout)
    peft = PeftModel.from_pretrained(tiny_llama().model, str(path / "adapters" / "policy")).eval()
    assert sum("lora_A" in n for n, _ in peft.named_parameters()) == 8  # q, k, v, o of both blocks
    with torch.no_grad():
        logits = peft(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask,
                      position_ids=positions(rollout.attention_mask)).logits[:, rollout.prompt_len - 1:-1].float()
    got = logits.log_softmax(-1).gather(-1, rollout.input_ids[:, rollout.prompt_len:, None])[..., 0]
    np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), atol=1e-5)
    loaded = saved_policy(path, backbone=tiny_llama())
    asks = ["Tell me about the medlar.", "Where do sapote trees grow?"]
    greedy = [p.generate(asks, 6, generator=torch.Generator().manual_seed(0), temperature=0).responses
              for p in (policy, loaded)]
    assert greedy[0] == greedy[1]


def test_rloo_step_is_deterministic_and_bad_settings_are_refused():
    config = CONFIG.model_copy(update={"rounds": 1, "test_fraction": 0.0, "step": "rloo", "samples": 2})
    texts = [p["prompt"] for p in prompts(4)]
    runs = [train_firm(config, texts, rewards=["length", mentions_fruit]) for _ in range(2)]
    a, b = (r.model.adapter_state() for r in runs)
    assert all(np.array_equal(a[k], b[k]) for k in a) and any(np.abs(a[k]).max() > 0 for k in a if k.endswith(".B"))
    last = runs[0].metrics["rounds"][-1]
    assert last["lambda_0"] + last["lambda_1"] == pytest.approx(1) and len(last["lambda_steps"][0]) == 1  # 1 step
    with pytest.raises(ValueError, match="preference has 2 weights but there are 3 rewards"):
        train_firm(config, texts, rewards=["length", "brevity", mentions_fruit])
    cmoo = train_firm(config.model_copy(update={"rule": "fedcmoo-a"}), texts, rewards=["length", "brevity"])
    assert cmoo.metrics["rounds"][-1]["round"] == 1 and "lambda_0" in cmoo.metrics["rounds"][-1]


def test_malformed_line(tmp_path):
    assert_bad_line_named(lambda p: train_firm(CONFIG, p, rewards=["length"]), tmp_path, prompts(6), "prompt", 3)


@pytest.mark.real
def test_real_smollm2_smoke(tmp_path):
    config = FIRMConfig(rounds=1, clients=2, batch_size=1, max_new_tokens=4, test_fraction=0.0,
                        lora=dict(blocks=1), ppo=dict(minibatch=1))
    result = train_firm(config, ["Name a fruit that grows on trees.", "How do I store quinces?"])
    path = result.save(tmp_path / "run")
    assert result.metrics["objectives"] == ["relevance", "brevity"] and "lambda_0" in result.metrics["rounds"][-1]
    loaded = saved_policy(path)
    reply = loaded.generate(["Name a fruit."], 4, generator=torch.Generator().manual_seed(0), temperature=0)
    assert reply.responses[0] == result.model.generate(["Name a fruit."], 4, generator=torch.Generator().manual_seed(
        0), temperature=0).responses[0]


def test_a_hugging_face_reward_model_by_path(tmp_path):
    """A sequence-classification reward model given by its folder (a tiny random Llama classifier saved here; a hub
    name goes the same way) is scored through `HFRewardModel` as one of the rewards."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    tokenizer = tiny_llama().tokenizer
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    quick = CONFIG.model_copy(update={"rounds": 1})
    result = train_firm(quick, [p["prompt"] for p in prompts()], rewards=[str(tmp_path / "rm"), "brevity"])
    assert result.metrics["objectives"] == [str(tmp_path / "rm"), "brevity"]
    assert 0 < result.metrics["eval_reward_0"] < 1  # a sigmoid of the classifier's logit
