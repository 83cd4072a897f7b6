import json

import numpy as np
from peft import PeftModel

from collabalign.methods.fedavg_lora import FedAvgLoRAConfig, train_fedavg_lora
from collabalign.models.backbones import tiny_llama
from collabalign.models.saved import SavedScorer
from tests.entry.helpers import assert_bad_line_named, pooled_scores, user_pairs, write_jsonl

CONFIG = FedAvgLoRAConfig(model="tiny-llama", rounds=3, max_length=32, lr=5e-3)


def test_trains_on_a_users_file_and_saves_a_peft_reward_model(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", user_pairs(48))
    result = train_fedavg_lora(CONFIG, path)
    assert result.metrics["clients"] == 3 and result.metrics["test_pairs"] == 10
    assert result.metrics["accuracy"] > 0.5  # the fruit task is learned above chance in 3 rounds
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
