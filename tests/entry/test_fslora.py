import copy
import json
from functools import cache

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from collabalign.commands import CONFIG_DIR
from collabalign.config import ConfigError
from collabalign.data.formats import load_labelled
from collabalign.jobs import read_spec
from collabalign.lora.inject import lora_layers, routed
from collabalign.methods.fslora import FSLoRAConfig, sketch_indices, train_fslora
from collabalign.methods.fslora.entry import LR_GRID, fslora_job
from collabalign.models.backbones import Backbone, tiny_llama
from collabalign.models.saved import SavedScorer
from collabalign.seeding import Seeds
from collabalign.selection import best
from tests.entry.helpers import assert_bad_line_named, pooled_scores, write_jsonl

CONFIG = FSLoRAConfig(model="tiny-llama", ranks=[2, 4], lora={"rank": 8, "alpha": 8.0, "blocks": 1}, rounds=3,
                      local_steps=5, optimizer="sgd", lr=0.02, max_length=32)
BRIGHT, DULL = ["zindle", "quorf", "plimsy"], ["grabnok", "vextol", "drummish"]
PROBES = ["the plimsy of tuvel number 99", "a grabnok", "quorf quorf"]


def sentences(n: int = 48, regression: bool = False) -> list[dict]:
    """Labelled sentences: class 1 (score 0.9) when the invented word is a bright one, 0 (score 0.1) when dull."""
    rows = []
    for i in range(n):
        bright = i % 2 == 0
        word = (BRIGHT if bright else DULL)[i // 2 % 3]
        label = (0.9 if bright else 0.1) if regression else int(bright)
        rows.append({"text": f"the {word} of tuvel number {i}", "label": label})
    return rows


@cache
def bare() -> Backbone:
    return tiny_llama()


def fresh() -> Backbone:
    """A copy of one bare tiny Llama, as `tiny_llama()` gives (a saved adapter is injected into the model it loads
    on), without reading the tokenizer again."""
    return Backbone(copy.deepcopy(bare().model), bare().tokenizer, bare().causal)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """CONFIG's run on `sentences()`, trained once for the tests that read it."""
    path = write_jsonl(tmp_path_factory.mktemp("fslora") / "mine.jsonl", sentences())
    return path, train_fslora(CONFIG, path)


def test_global_and_device_adapters_reload_as_trained(tmp_path, trained):
    result = trained[1]
    assert result.metrics["devices"] == 2 and result.metrics["test_examples"] == 10
    assert result.metrics["rounds"][-1]["loss"] < result.metrics["rounds"][0]["loss"]  # it trains
    baseline = result.metrics["baseline"]  # the global classifier and a logistic probe on the same 10 examples
    assert baseline["ours"] == pytest.approx(result.metrics["accuracy"]) and baseline["items"] == 10
    run = result.save(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert (manifest["method"], manifest["kind"], manifest["base_model"]) == ("fslora", "classifier", "tiny-llama")
    assert manifest["adapters"] == ["device-0", "device-1", "global"] and len(manifest["data_hash"]) == 64
    backbone = fresh()
    scores = pooled_scores(result.model, backbone.tokenizer, PROBES, 32)
    assert scores.shape == (3, 2)
    np.testing.assert_allclose(SavedScorer(run, "global", backbone)(PROBES), scores, atol=1e-5)
    for i, k in enumerate(CONFIG.ranks):  # a device's sketch of the global factors (the next round's), scale s*r/k
        config = json.loads((run / "adapters" / f"device-{i}" / "adapter_config.json").read_text())
        assert config["r"] == k and config["lora_alpha"] / k == pytest.approx(8.0 / 8**0.5 * 8 / k)
        idx = {n: torch.from_numpy(sketch_indices(Seeds(0), 4, f"device{i}", f"pooled.{n}", 8, k)).long()
               for n in lora_layers(result.model)}
        with routed(result.model, rank_idx=idx):
            device = pooled_scores(result.model, backbone.tokenizer, PROBES, 32)
        assert not np.allclose(device, scores, atol=1e-4)  # the sketch is not the global model
        np.testing.assert_allclose(SavedScorer(run, f"device-{i}", fresh())(PROBES), device, atol=1e-5)


def test_regression_file_gives_one_output(tmp_path):
    config = CONFIG.model_copy(update={"method": "flexlora"})
    path = write_jsonl(tmp_path / "scores.jsonl", sentences(24, regression=True))
    result = train_fslora(config, path)
    assert "pearson" in result.metrics and result.metrics["test_examples"] == 5
    again = train_fslora(config, load_labelled(path))  # already-loaded data; same config and seed: same adapters
    for name, adapter in result.adapters.items():
        for key, tensor in adapter.tensors.items():
            assert torch.equal(tensor, again.adapters[name].tensors[key])
    run = result.save(tmp_path / "run")
    backbone = fresh()
    expected = pooled_scores(result.model, backbone.tokenizer, PROBES, 32)
    assert expected.shape == (3, 1)
    np.testing.assert_allclose(SavedScorer(run, backbone=backbone)(PROBES), expected[:, 0], atol=1e-5)
    assert SavedScorer(run, "device-0", fresh())(PROBES).shape == (3,)


def test_malformed_label_line(tmp_path):
    assert_bad_line_named(lambda p: train_fslora(CONFIG, p), tmp_path, sentences(6), "label", "bright")


def test_device_rank_above_global_rank_is_refused():
    with pytest.raises(ValidationError, match="at most the global rank"):
        FSLoRAConfig(ranks=[2, 16], lora={"rank": 8})


@pytest.mark.real
def test_real_encoder_smoke(tmp_path):
    config = FSLoRAConfig(model="minilm-l6", ranks=[2, 4], rounds=5, local_steps=3, max_length=16)
    result = train_fslora(config, write_jsonl(tmp_path / "mine.jsonl", sentences(48)))
    assert result.metrics["accuracy"] >= 0.9  # the bright/dull words are learned (10 held-out sentences)
    run = result.save(tmp_path / "run")
    scorer = SavedScorer(run)  # the base model loaded by name from the manifest
    expected = pooled_scores(result.model, scorer.tokenizer, PROBES, 16)
    np.testing.assert_allclose(scorer(PROBES), expected, atol=1e-5)
    assert SavedScorer(run, "device-0")(PROBES).shape == (3, 2)


@pytest.mark.parametrize("method", ["ffa-lora", "fedsa-lora", "fedex-lora"])
def test_lora_variants_train_and_their_adapters_reload(tmp_path, method):
    config = CONFIG.model_copy(update={"method": method, "ranks": [8, 8]})
    result = train_fslora(config, write_jsonl(tmp_path / "mine.jsonl", sentences()))
    assert result.metrics["rounds"][-1]["loss"] < result.metrics["rounds"][0]["loss"]  # it trains
    run = result.save(tmp_path / "run")
    names = json.loads((run / "manifest.json").read_text())["adapters"]
    assert names == ["device-0", "device-1"] + ([] if method == "fedsa-lora" else ["global"])
    backbone = fresh()
    scores = pooled_scores(result.model, backbone.tokenizer, PROBES, 32)  # the global model, or the last device's
    np.testing.assert_allclose(SavedScorer(run, names[-1], backbone)(PROBES), scores, atol=1e-4)
    devices = [SavedScorer(run, f"device-{i}", fresh())(PROBES) for i in range(2)]
    assert np.allclose(devices[0], devices[1]) == (method != "fedsa-lora")  # FedSA-LoRA's B is each device's own


def test_server_optimizer_is_refused_where_the_method_cannot_take_it():
    with pytest.raises(ValidationError, match="not flexlora"):
        FSLoRAConfig(method="flexlora", server_optimizer={"rule": "fedadam", "lr": 0.01})
    with pytest.raises(ValidationError, match="fedprox corrects"):
        FSLoRAConfig(server_optimizer={"rule": "fedprox"})
    with pytest.raises(ValidationError, match="not both"):
        FSLoRAConfig(server_lr=1e-3, server_optimizer={"rule": "fedadam"})
    FSLoRAConfig(method="fedex-lora", server_optimizer={"rule": "fedavg"})  # the plain average is every method's


def test_server_optimizer_steps_fslora(trained):
    path, plain = trained
    config = FSLoRAConfig(**CONFIG.model_dump() | {"server_optimizer": {"rule": "fedadam", "lr": 0.01}})
    adam = train_fslora(config, path)
    assert adam.metrics["rounds"][-1]["loss"] != plain.metrics["rounds"][-1]["loss"]


def test_lr_auto_is_chosen_on_a_slice_of_the_training_examples_and_a_deployment_needs_a_number(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", sentences())
    config = CONFIG.model_copy(update={"optimizer": "adamw", "lr": "auto"})
    result = train_fslora(config, path)
    selection = result.metrics["lr_selection"]  # 38 training sentences: 8 to choose on, 30 to train the grid on
    assert selection["examples"] == 8 and list(selection["scores"]) == [f"{lr:g}" for lr in LR_GRID]
    assert result.metrics["lr"] == selection["chosen"] == best({float(k): v for k, v in selection["scores"].items()})
    fixed = train_fslora(config.model_copy(update={"lr": selection["chosen"]}), path)
    np.testing.assert_array_equal(fixed.adapters["global"].head["weight"], result.adapters["global"].head["weight"])
    with pytest.raises(ConfigError, match="a deployment needs a number"):
        fslora_job(config, path)
    with pytest.raises(ConfigError, match="lr = auto: chosen by training in process"):  # before any model loads
        read_spec(CONFIG_DIR / "deploy" / "fslora.yaml", ["lr=auto"])
    with pytest.raises(ValidationError, match="momentum is for optimizer: sgd"):
        FSLoRAConfig(momentum=0.9)
