import copy

import pytest
import torch

from collabalign.models.backbones import Backbone, tiny_llama
from collabalign.policy import Policy


@pytest.fixture(scope="session")
def backbone() -> Backbone:
    return tiny_llama(seed=0)


@pytest.fixture
def make_policy(backbone):
    """Fresh policies on copies of one tiny Llama. `gain` scales the final norm: a random init caps every logit near
    ±1.3 (unit-norm hidden x8, embeddings of norm 0.16), so no adapter could make the policy peaked without it."""

    def make(gain: float = 1.0, **kwargs) -> Policy:
        model = copy.deepcopy(backbone.model)
        with torch.no_grad():
            model.model.norm.weight.mul_(gain)
        kwargs = {"rank": 8, "alpha": 16.0, "dropout": 0.0, "generator": torch.Generator().manual_seed(0)} | kwargs
        return Policy(Backbone(model, backbone.tokenizer, True), **kwargs)

    return make


@pytest.fixture
def make_gpt2_policy(backbone):
    """A tiny random GPT-2 (absolute position embeddings, so left padding needs explicit position ids) with LoRA on
    its output layer, the one nn.Linear it has (its attention uses Conv1D)."""

    def make() -> Policy:
        from transformers import GPT2Config, GPT2LMHeadModel

        tok = backbone.tokenizer
        config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=2, n_positions=256,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = GPT2LMHeadModel(config).eval()
        return Policy(Backbone(model, tok, True), targets=("lm_head",), rank=4, dropout=0.0,
                      generator=torch.Generator().manual_seed(0))

    return make
