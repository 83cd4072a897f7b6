"""Federated SFT and DPO (methods/fed_tune.py, methods/policy_trainer.py) on the tiny Llama: the losses as their
formulas, the cached trunk equal to the full forward, the splits, and a run that learns and saves its policy."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from collabalign.data.errors import DataError
from collabalign.data.preferences import PreferencePair
from collabalign.examples import write_examples
from collabalign.methods.fed_tune import FedTuneConfig, split_clients, train_fed_tune
from collabalign.methods.policy_trainer import PolicyTrainer, base_ranking_accuracy, encode_policy_pairs
from collabalign.models.backbones import tiny_llama
from collabalign.policy.model import Policy
from collabalign.policy.saved import saved_policy
from collabalign.seeding import Seeds

PAIRS = [PreferencePair(f"question {i} about plants?", "water it " * (1 + i % 3), "ignore it " * (2 + i % 2))
         for i in range(6)]


def policy(targets=("lm_head",)):
    return Policy(tiny_llama(), targets, rank=4, alpha=8.0, dropout=0.0, generator=Seeds(0).torch("lora"))


def test_sft_loss_is_the_nll_per_token_of_the_chosen_replies_and_the_cached_trunk_equals_the_full_forward():
    head, full = policy(), policy(("q_proj", "v_proj"))
    cached = encode_policy_pairs(head, PAIRS, "sft", 64, 5)
    assert cached.rejected is None and cached.chosen.trunk is not None
    with torch.no_grad():
        head.layers[0].B.normal_()  # a trained-looking head adapter
        trainer = PolicyTrainer(head, "sft", cached, lr=1e-3, steps=1, batch_size=2)
        loss, per_pair = trainer.loss(cached)
        rollout = head.rollout([p.prompt for p in PAIRS], [p.chosen for p in PAIRS], max_response_tokens=5)
        logps = head.token_logprobs(rollout)  # the whole model, no cache
    tokens = rollout.mask.sum(1)
    assert loss.item() == pytest.approx(float(-logps.sum() / tokens.sum()), rel=1e-5)
    np.testing.assert_allclose(per_pair.numpy(), (-logps.sum(1) / tokens).numpy(), rtol=1e-5)
    assert int(tokens.max()) == 5  # "water it water it water it" is cut at 5 tokens ...
    cut = [i for i, p in enumerate(PAIRS) if len(head.tokenizer(p.chosen, add_special_tokens=False)["input_ids"]) >= 5]
    for i in cut:  # ... and a cut reply has no EOS
        assert head.eos_id not in rollout.input_ids[i, rollout.prompt_len:][rollout.mask[i]].tolist()
    assert encode_policy_pairs(full, PAIRS, "sft", 64, 5).chosen.trunk is None  # adapters inside: no cache


def test_dpo_starts_at_log_2_with_the_adapters_off_model_as_reference():
    pol = policy()
    pairs = encode_policy_pairs(pol, PAIRS, "dpo", 64, 8)
    with torch.no_grad():
        chosen = pol.token_logprobs(pol.rollout([p.prompt for p in PAIRS], [p.chosen for p in PAIRS],
                                                max_response_tokens=8), reference=True).sum(1)
    np.testing.assert_allclose(pairs.ref_chosen.numpy(), chosen.numpy(), rtol=1e-5)
    trainer = PolicyTrainer(pol, "dpo", pairs, lr=1e-2, steps=20, batch_size=4, beta=0.5)
    start = trainer.initial_params(Seeds(0))
    assert trainer.evaluate(start) == {"accuracy": 0.5, "loss": pytest.approx(np.log(2), rel=1e-6),
                                       "ranking": base_ranking_accuracy(pairs)}  # the untrained policy is the base
    trained, n = trainer.train(start, pairs, torch.Generator().manual_seed(0))
    metrics = trainer.evaluate(trained)
    assert n == len(PAIRS) and metrics["loss"] < np.log(2)  # it fits its own pairs
    with torch.no_grad():  # its own ranking: the trained policy's log-prob sums, chosen against rejected
        own = (pol.token_logprobs(pairs.chosen).sum(1) - pol.token_logprobs(pairs.rejected).sum(1)).numpy()
    assert metrics["ranking"] == pytest.approx(float(np.mean((own > 0) + 0.5 * (own == 0))))


def test_a_long_prompt_is_named():
    long = replace(PAIRS[0], prompt="word " * 80)
    with pytest.raises(ValueError, match=r"pairs 0-1: prompt 1 is \d+ tokens long, over max_prompt_tokens=64"):
        encode_policy_pairs(policy(), [PAIRS[1], long], "sft", 64, 8)


def test_clients_by_user_by_iid_split_or_dirichlet_over_an_attribute():
    config = FedTuneConfig(clients=2, batch_size=2, split="dirichlet", split_key="topic", dirichlet_alpha=0.1)
    rng = np.random.default_rng(0)
    by_user = [replace(p, party=f"u{i % 3}") for i, p in enumerate(PAIRS)]
    assert [list(p) for p in split_clients(config, by_user, rng)] == [[0, 3], [1, 4], [2, 5]]
    topics = [replace(p, attributes={"topic": "a" if i < 3 else "b"}) for i, p in enumerate(PAIRS * 2)]
    parts = split_clients(config, topics, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(12)) and min(map(len, parts)) >= 2
    with pytest.raises(DataError, match="needs every pair's 'topic'"):
        split_clients(config, PAIRS, rng)
    assert [len(p) for p in split_clients(config.model_copy(update={"split": "iid"}), PAIRS, rng)] == [3, 3]


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_examples(tmp_path_factory.mktemp("examples"))


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_a_federated_run_learns_repeats_and_saves_its_policy(objective, examples, tmp_path):
    # SFT on replies cut at 16 tokens (its NLL still falls by ~0.7 nats, the interval far from 0); DPO's loss falls
    # little below log 2 in these 8 steps, so it keeps the whole replies
    config = FedTuneConfig(objective=objective, model="tiny-llama", rounds=2, local_steps=4, batch_size=4, lr=1e-2,
                           server_optimizer={"rule": "scaffold"}, max_response_tokens=16 if objective == "sft" else 64)
    result = train_fed_tune(config, examples["pairs"])
    metrics = result.metrics
    if objective == "sft":
        assert metrics["nll"] < metrics["base"]["nll"]
    else:
        assert metrics["loss"] < metrics["base"]["loss"] and 0 <= metrics["base_accuracy"] <= 1
    assert metrics["clients"] == 3 and metrics["long_prompts_left_out"] == 0
    baseline = metrics["baseline"]  # against the base policy on the same held-out pairs
    if objective == "sft":
        assert baseline["verdict"] == "beats" and baseline["baseline_value"] > baseline["ours"]  # NLL: lower wins
    else:
        assert baseline["baseline_value"] == pytest.approx(metrics["base_accuracy"])
        assert baseline["ours"] == pytest.approx(metrics["ranking"])
    if objective == "sft":
        assert train_fed_tune(config, examples["pairs"]).metrics == metrics  # same config and seed: same run
    run = result.save(tmp_path / "run")
    assert json.loads((run / "manifest.json").read_text())["method"] == f"fed-{objective}"
    loaded = saved_policy(run, backbone=tiny_llama())
    for name, value in result.model.adapter_state().items():
        np.testing.assert_allclose(loaded.adapter_state()[name], value, atol=1e-6)


def test_prompts_over_the_limit_are_left_out_and_counted(examples):
    config = FedTuneConfig(model="tiny-llama", rounds=1, local_steps=1, max_prompt_tokens=38,  # 37-40 tokens here
                           max_response_tokens=2)  # the replies do not count: 2 tokens of each are enough
    metrics = train_fed_tune(config, examples["pairs"]).metrics
    assert metrics["long_prompts_left_out"] == 24
    assert metrics["train_pairs"] + metrics["test_pairs"] + metrics["long_prompts_left_out"] == 96
