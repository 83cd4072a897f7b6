import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from collabalign.config import ConfigError
from collabalign.models.backbones import (
    SMOLLM2_GGUF,
    SMOLLM2_PACKAGE,
    _smollm2_cache,
    load_backbone,
    minilm_l6,
    package_dir,
    sha256,
    smollm2_135m,
    smollm2_tokenizer,
    tiny_llama,
)


def test_package_dir_finds_the_gguf_without_importing_the_package():
    code = ("import sys; from collabalign.models.backbones import package_dir; "
            f"print((package_dir('{SMOLLM2_PACKAGE}') / '{SMOLLM2_GGUF}').exists(), "
            f"'{SMOLLM2_PACKAGE}' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


def test_missing_package_says_how_to_install():
    with pytest.raises(FileNotFoundError, match="no_such_model_pkg.*make venv"):
        package_dir("no_such_model_pkg")


def test_tiny_llama_is_seeded_and_uses_the_smollm2_vocabulary():
    a, b, c = tiny_llama(seed=1), tiny_llama(seed=1), tiny_llama(seed=2)
    assert a.causal and a.model.config.vocab_size == len(a.tokenizer) == 49152
    wa, wb, wc = (m.model.model.layers[0].self_attn.q_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    ids = a.tokenizer("Hello there", return_tensors="pt").input_ids
    assert a.tokenizer.decode(ids[0]) == "Hello there"


def test_each_tokenizer_copy_keeps_its_own_settings():
    a, b = smollm2_tokenizer(), smollm2_tokenizer()
    a.truncation_side = a.padding_side = "left"
    a.pad_token = a.bos_token
    text = "one two three four five six seven eight nine ten"
    cut = a([text, "hi"], truncation=True, max_length=4, padding=True).input_ids
    assert cut[0] == b(text).input_ids[-4:] and cut[1][:3] == [a.bos_token_id] * 3  # cut and padded on the left
    assert (b.truncation_side, b.padding_side, b.pad_token) == ("right", "right", "<|im_end|>")
    assert b([text, "hi"], truncation=True, max_length=4, padding=True).input_ids == [
        b(text).input_ids[:4], b("hi").input_ids + [b.pad_token_id] * 3]  # b: its own sides and pad token
    assert len(b(text * 20).input_ids) > 100  # a's truncation does not stay on the shared Rust tokenizer


def test_load_backbone_reads_any_saved_model_directory(tmp_path):
    tiny = tiny_llama(seed=3)
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_backbone(str(tmp_path))
    assert loaded.causal
    ids = torch.tensor([[1, 5, 9, 200]])
    torch.testing.assert_close(loaded.model(ids).logits, tiny.model(ids).logits)


def test_load_backbone_rejects_a_missing_path(tmp_path):
    with pytest.raises(ConfigError, match="nothing-here': not found; a model is one of tiny-llama"):
        load_backbone(str(tmp_path / "nothing-here"))


@pytest.mark.real
def test_smollm2_from_the_gguf_cache_answers_a_simple_question():
    backbone = smollm2_135m()
    gguf, root = _smollm2_cache()
    assert (root / "model" / "model.safetensors").exists()
    assert sha256(gguf)[:16] in root.name
    assert sum(p.numel() for p in backbone.model.parameters()) == 134_515_008
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = backbone.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)
    out = backbone.model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert "Paris" in backbone.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:])


@pytest.mark.real
def test_minilm_embeddings_rank_a_paraphrase_above_an_unrelated_sentence():
    backbone = minilm_l6()
    assert not backbone.causal and backbone.model.config.hidden_size == 384
    enc = backbone.tokenizer(["A cat sits on the mat.", "A kitten rests on the rug.", "Stock markets fell sharply."],
                             padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = backbone.model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1)
    emb = F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert emb[0] @ emb[1] > emb[0] @ emb[2] + 0.3
