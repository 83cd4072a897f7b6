"""The documented JSONL formats: each loads what it says and names file, line and field for a bad row."""

import copy
import json

import numpy as np
import pytest
import torch
from peft import PeftModel
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from collabalign.data.errors import DataError
from collabalign.data.formats import EXAMPLES, load_labelled, load_pairs, load_prompts, load_texts
from collabalign.lora import inject_lora, save_peft
from collabalign.lora.targets import default_targets
from tests.entry.helpers import write_jsonl


def test_each_documented_example_line_loads(tmp_path):
    pairs = load_pairs(write_jsonl(tmp_path / "p.jsonl", [json.loads(EXAMPLES["pairs"])]))
    assert pairs[0].party == "ana" and pairs[0].chosen == "A cat sat."
    assert load_prompts(write_jsonl(tmp_path / "q.jsonl", [json.loads(EXAMPLES["prompts"])])) == [
        "How do I keep basil fresh?"]
    rows = [json.loads(EXAMPLES["labelled"]), {"text": "a dull film", "label": 0}]  # one class: nothing to learn
    labelled = load_labelled(write_jsonl(tmp_path / "l.jsonl", rows))
    assert labelled.labels.tolist() == [1, 0] and labelled.num_labels == 2 and labelled.text_b is None


def test_pairs_keep_user_and_domain_and_require_them_when_asked(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c", "user": 7,
                                               "domain": "kelp"}, {"prompt": "a", "chosen": "b", "rejected": "d"}])
    got = load_pairs(path)
    assert got[0].party == "7" and got[0].attributes == {"domain": "kelp"} and got[1].party is None
    with pytest.raises(DataError, match=r"p.jsonl:2: field 'user': missing field"):
        load_pairs(path, require=("user",))


@pytest.mark.parametrize(("loader", "row", "field"), [
    (load_pairs, {"prompt": "a", "chosen": "b", "rejected": "b"}, "rejected"),
    (load_pairs, {"prompt": "a", "chosen": "b", "rejected": "c", "user": [1]}, "user"),
    (load_prompts, {"prompt": 3}, "prompt"),
    (load_labelled, {"text": "x", "label": True}, "label"),
    (load_labelled, {"text": "x", "label": -1}, "label"),
    (load_labelled, {"text": "x", "text_pair": "y", "label": 1}, "text_pair"),
    (load_texts, {"prompt": "x"}, "response"),
])
def test_a_bad_third_line_is_named(tmp_path, loader, row, field):
    good = {load_pairs: {"prompt": "a", "chosen": "b", "rejected": "c"}, load_prompts: {"prompt": "p"},
            load_labelled: {"text": "t", "label": 0}, load_texts: {"text": "t"}}[loader]
    path = write_jsonl(tmp_path / "f.jsonl", [good, good, row])
    with pytest.raises(DataError) as err:
        loader(path)
    assert (err.value.line, err.value.field) == (3, field)


def test_float_labels_make_a_regression_task(tmp_path):
    data = load_labelled(write_jsonl(tmp_path / "r.jsonl", [{"text": "a", "label": 0.5}, {"text": "b", "label": 2}]))
    assert data.num_labels == 1 and data.labels.dtype == np.float32 and data.metric == "pearson"


def test_default_targets_per_architecture_and_gpt2_conv1d(tmp_path):
    bert = BertModel(BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16))
    assert default_targets(bert) == ["query", "key", "value"] and default_targets(bert, ["dense"]) == ["dense"]
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=1, n_head=2)).eval()
    bare = copy.deepcopy(gpt2)
    ids = torch.arange(6)[None]
    before = gpt2(ids).logits
    layers = inject_lora(gpt2, default_targets(gpt2), rank=2)
    assert list(layers) == ["transformer.h.0.attn.c_attn"]
    torch.testing.assert_close(gpt2(ids).logits, before)  # B = 0: the same function
    torch.nn.init.normal_(layers["transformer.h.0.attn.c_attn"].B)
    save_peft(gpt2, tmp_path / "gpt2")
    assert json.loads((tmp_path / "gpt2" / "adapter_config.json").read_text())["fan_in_fan_out"] is True
    loaded = PeftModel.from_pretrained(bare, str(tmp_path / "gpt2")).eval()
    torch.testing.assert_close(loaded(ids).logits, gpt2(ids).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="set lora.targets"):
        default_targets(torch.nn.Linear(2, 2))
