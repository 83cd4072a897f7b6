import copy

import torch
from peft import PeftModel
from transformers import BertConfig, BertModel

from collabalign.lora import inject_lora, routed, save_peft


def test_peft_export_round_trip_gives_identical_outputs(tmp_path):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=32, max_position_embeddings=32)
    base = BertModel(cfg).eval()
    ours = copy.deepcopy(base)
    layers = inject_lora(ours, ["query", "value"], rank=4, alpha=8, parties_b=3)
    with torch.no_grad():
        for layer in layers.values():
            layer.A.normal_()
            layer.B.normal_()
    ids = torch.randint(0, 50, (2, 7))
    with routed(ours, party=2):
        expected = ours(input_ids=ids).last_hidden_state
    save_peft(ours, tmp_path / "adapter", party=2)
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    got = loaded(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    with routed(ours, party=0):
        other = ours(input_ids=ids).last_hidden_state
    assert (other - got).abs().max() > 1e-3  # party 2's adapter, not any party's
