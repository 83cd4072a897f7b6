"""Shared by the P-ShareLoRA text tests: a tiny random 6-block BERT with MiniLM's tokenizer."""

import torch
from transformers import AutoTokenizer, BertConfig, BertModel

from collabalign.models.backbones import MINILM_PACKAGE, Backbone, package_dir


def tiny_bert() -> Backbone:
    """A random BERT (hidden 16, 6 blocks, 2 heads), seeded, in eval mode."""
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=16, num_hidden_layers=6, num_attention_heads=2, intermediate_size=32))
    return Backbone(model.eval(), AutoTokenizer.from_pretrained(package_dir(MINILM_PACKAGE) / "model"), False)
