"""The baseline beside every result: the comparison record (paired, per-group weighting, the claims rule's verdict),
its sentence, the probes (Bradley-Terry on pairs, logistic / ridge on labels, strength chosen on training rows only)
and the frozen features they read (LoRA switched off, whatever its state)."""

import copy

import numpy as np
import pytest
import torch

from collabalign.baselines import bt_probe, compare, label_probe, probe_hits, probe_pairs, sentence
from collabalign.lora.inject import lora_layers
from collabalign.models.backbones import tiny_llama
from collabalign.models.cached import cache_texts, frozen_features, lora_top_blocks
from collabalign.models.pooled import PooledModel


def test_a_clear_gain_beats_a_clear_loss_loses_and_noise_ties():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2, 200).astype(float)
    better = np.where(rng.random(200) < 0.5, 1.0, base)  # right wherever the baseline is, and on half the rest
    assert compare("accuracy", better, base, "b")["verdict"] == "beats"
    assert compare("accuracy", base, better, "b")["verdict"] == "loses to"
    assert compare("accuracy", base, base[::-1].copy(), "b")["verdict"] == "ties with"
    errors = compare("squared error", base * 0.5, base, "b", lower_is_better=True)  # lower errors win
    assert errors["verdict"] == "beats" and errors["difference"] < 0


def test_groups_weigh_the_same_as_a_per_user_mean_does():
    ours = np.array([1, 1, 1, 1, 1, 1, 1, 1, 0, 0], dtype=float)  # user 0: 8 pairs all right; user 1: 2 pairs wrong
    base = np.full(10, 0.5)
    groups = np.array([0] * 8 + [1] * 2)
    record = compare("accuracy", ours, base, "coin", groups=groups)
    assert record["ours"] == pytest.approx(0.5) and record["baseline_value"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert record["difference"] == pytest.approx(0.0, abs=1e-12) and record["items"] == 10
    assert compare("accuracy", ours, base, "coin")["ours"] == pytest.approx(0.8)  # unweighted: pairs count


def test_the_sentence_says_plainly_when_the_baseline_is_not_beaten():
    worse = compare("accuracy", np.zeros(30), np.ones(30), "a probe")
    assert "does NOT beat its baseline" in sentence("m", worse) and "a probe" in sentence("m", worse)
    better = compare("accuracy", np.r_[np.ones(25), np.zeros(5)], np.r_[np.zeros(25), np.ones(5)], "a probe")
    assert sentence("m", better).endswith("it beats its baseline") and "+0.667" in sentence("m", better)


def test_paired_scores_must_match():
    with pytest.raises(ValueError, match="paired"):
        compare("accuracy", np.ones(3), np.ones(4), "b")


def test_the_bradley_terry_probe_learns_a_direction_and_a_probe_per_group_uses_only_its_own_pairs():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 6))
    pairs = np.arange(200)
    chosen, rejected = 2 * pairs, 2 * pairs + 1
    group = pairs % 2
    # group 0 prefers a higher first feature, group 1 a lower one
    sign = np.where(group == 0, 1.0, -1.0)
    swap = sign * (x[chosen, 0] - x[rejected, 0]) < 0
    chosen, rejected = np.where(swap, rejected, chosen), np.where(swap, chosen, rejected)
    train, test = pairs[:150], pairs[150:]
    per_group = probe_pairs(x, chosen, rejected, train, test, np.random.default_rng(0), groups=group)
    pooled = probe_pairs(x, chosen, rejected, train, test, np.random.default_rng(0))
    assert per_group.mean() > 0.9 and pooled.mean() < 0.75  # one probe for both cannot serve opposite preferences
    head = bt_probe(x[chosen[train]], x[rejected[train]], np.random.default_rng(0))
    assert np.array_equal(probe_hits(head, x[chosen[test]], x[rejected[test]]), pooled)  # the same fit, repeated


def test_label_probes_classify_and_regress_from_training_rows_only():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 5))
    labels = (x[:, 1] > 0).astype(int)
    train, test = np.arange(200), np.arange(200, 300)
    hits = label_probe(x, labels, train, test, np.random.default_rng(0))
    assert hits.mean() > 0.9 and set(np.unique(hits)) <= {0.0, 1.0}
    target = 3 * x[:, 2] + 0.1 * rng.normal(size=300)
    errors = label_probe(x, target, train, test, np.random.default_rng(0), regression=True)
    assert errors.mean() < 0.1 * target[test].var()
    shuffled = labels.copy()
    shuffled[test] = 1 - shuffled[test]  # held-out labels never reach the fit: flipping them flips every hit
    assert np.array_equal(label_probe(x, shuffled, train, test, np.random.default_rng(0)), 1 - hits)


def test_frozen_features_switch_trained_lora_off_and_leave_it_as_it_was():
    backbone = tiny_llama()
    model = copy.deepcopy(backbone.model)
    texts = ["the quince is sweet", "go away", "a medlar, bletted"]
    pooled = PooledModel(model, backbone.causal, 1)
    split = lora_top_blocks(pooled, 1, ["q_proj", "v_proj"], 4)
    cache = cache_texts(pooled, backbone.tokenizer, texts, 16, split)
    bare = frozen_features(model, backbone.causal, cache)
    for layer in lora_layers(model).values():
        torch.nn.init.normal_(layer.B)  # trained: the adapter now changes the features
    model.train()
    assert torch.equal(frozen_features(model, backbone.causal, cache), bare)
    assert all(layer.enabled for layer in lora_layers(model).values()) and model.training
    reference = PooledModel(backbone.model, backbone.causal, 1)
    reference.head = torch.nn.Identity()
    from collabalign.models.pooled import tokenize

    with torch.no_grad():
        expected = reference(tokenize(backbone.tokenizer, texts, 16))
    torch.testing.assert_close(bare, expected, rtol=1e-5, atol=1e-5)  # the backbone's own pooled state


def test_a_deployments_report_states_the_baseline(tmp_path):
    from collabalign import jobs
    from collabalign.artifacts import Result
    from collabalign.deployment import write_report

    record = compare("accuracy", np.r_[np.ones(25), np.zeros(5)], np.r_[np.zeros(15), np.ones(15)], "a probe")
    Result("fedavg-lora", "reward", "tiny-llama", {}, "0" * 64, {"accuracy": 0.8, "baseline": record}).save(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"round": 0, "accuracy": 0.5}\n{"round": 1, "accuracy": 0.8}\n')
    report = write_report(tmp_path, jobs.read_spec(jobs.DEFAULT_CONFIG), 3, 10.0).read_text()
    assert f"Against its baseline: {sentence('fedavg-lora', record)}." in report
