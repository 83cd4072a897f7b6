import json

import numpy as np
import pytest
from peft import PeftModel

from collabalign.cli import main
from collabalign.methods.fedavg_lora import FedAvgLoRAConfig, train_fedavg_lora
from collabalign.models.backbones import tiny_llama
from collabalign.models.saved import SavedScorer
from tests.entry.helpers import assert_bad_line_named, pooled_scores, user_pairs, write_jsonl

CONFIG = FedAvgLoRAConfig(model="tiny-llama", rounds=3, max_length=32, lr=5e-3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """CONFIG's run on a user's 48 pairs, trained once for the tests that read it."""
    return train_fedavg_lora(CONFIG, write_jsonl(tmp_path_factory.mktemp("fedavg") / "mine.jsonl", user_pairs(48)))


def test_trains_on_a_users_file_and_saves_a_peft_reward_model(tmp_path, trained):
    result = trained
    assert result.metrics["clients"] == 3 and result.metrics["test_pairs"] == 10
    assert result.metrics["accuracy"] > 0.5  # the fruit task is learned above chance in 3 rounds
    baseline = result.metrics["baseline"]  # the same 10 held-out pairs, the probe fitted on the training pairs
    assert baseline["ours"] == pytest.approx(result.metrics["accuracy"]) and baseline["items"] == 10
    assert baseline["verdict"] in ("beats", "ties with", "loses to") and "Bradley-Terry probe" in baseline["baseline"]
    run = result.save(tmp_path / "run")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "fedavg-lora" and manifest["base_model"] == "tiny-llama"
    assert manifest["config"]["rounds"] == 3 and len(manifest["data_hash"]) == 64
    backbone = tiny_llama()
    texts = ["Tell me about the salak.The salak is sweet and lovely.", "hello"]
    expected = pooled_scores(result.model, backbone.tokenizer, texts, 32)[:, 0]
    np.testing.assert_allclose(SavedScorer(run, backbone=backbone)(texts), expected, atol=1e-5)
    peft = PeftModel.from_pretrained(tiny_llama().model, str(run / "adapters" / "global"))
    assert sum("lora_A" in n for n, _ in peft.named_parameters()) == 4  # q, k, v, o of the top block



def test_malformed_line(tmp_path):
    assert_bad_line_named(lambda p: train_fedavg_lora(CONFIG, p), tmp_path, user_pairs(6), "chosen", 7)


def test_score_cli_prints_the_saved_models_scores(tmp_path, capsys, trained):
    result = trained
    run = result.save(tmp_path / "run")
    texts = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "About quince?", "response": "Sweet."}, {"text": "hm"}])
    assert main(["score", str(run), "--file", str(texts)]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = pooled_scores(result.model, tiny_llama().tokenizer, ["About quince?Sweet.", "hm"], 32)[:, 0]
    np.testing.assert_allclose([row["score"] for row in printed], expected, atol=1e-5)
    assert main(["score", str(run), "--file", str(texts), "--user", "nobody"]) == 2
    assert "no adapter 'user-nobody'" in capsys.readouterr().err
    assert main(["generate", str(run), "--prompt", "hi"]) == 2  # a reward model is no policy: one line


@pytest.mark.parametrize("command", ["score", "generate"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0 and "run_dir" in capsys.readouterr().out


@pytest.mark.real
def test_real_smoke_on_smollm2(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", user_pairs(12))
    result = train_fedavg_lora(FedAvgLoRAConfig(model="smollm2-135m", rounds=1, max_length=32), path)
    run = result.save(tmp_path / "run")
    texts = ["Tell me about the salak.The salak is sweet and lovely."]
    scorer = SavedScorer(run)  # the base model loaded by the name in the manifest
    np.testing.assert_allclose(scorer(texts), pooled_scores(result.model, scorer.tokenizer, texts, 32)[:, 0],
                               atol=1e-5)
