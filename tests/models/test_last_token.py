"""The causal pooled model's last block at the last real token alone equals the whole block (float64)."""

import copy
from contextlib import nullcontext
from unittest import mock

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from collabalign.lora import lora_layers
from collabalign.models import last_token
from collabalign.models.backbones import smollm2_tokenizer
from collabalign.models.cached import lora_top_blocks
from collabalign.models.pooled import PooledModel, Tokens, layer_stack, tokenize

TEXTS = ["Human: how do I bake bread? Assistant: Mix flour, water and yeast, then bake it.", "No.",
         "Human: tell me a joke Assistant: Why did the chicken cross the road?", "Fine, thanks."]


@pytest.fixture(scope="module")
def gqa_llama():
    """Three Llama blocks with grouped-query attention (4 heads sharing 2 key-value heads, as SmolLM2's 9 share 3)."""
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LlamaForCausalLM(config).double().eval(), tokenizer


def model_with_lora(backbone, lora_blocks, targets):
    pooled = PooledModel(copy.deepcopy(backbone), True, 2, torch.Generator().manual_seed(0)).double()
    split = lora_top_blocks(pooled, lora_blocks, targets, rank=4)
    with torch.no_grad():
        for layer in lora_layers(pooled).values():
            layer.B.normal_(generator=torch.Generator().manual_seed(1))
    return pooled, split


def left_padded(tokens: Tokens) -> Tokens:
    """The same texts with their padding moved to the left."""
    shifts = (tokens.attention_mask == 0).sum(1)
    ids, mask = (torch.stack([row.roll(int(s)) for row, s in zip(x, shifts, strict=True)])
                 for x in (tokens.input_ids, tokens.attention_mask))
    return Tokens(ids, mask)


def scores_and_grads(pooled, tokens, features, split, last_token_path):
    pooled.zero_grad()
    with nullcontext() if last_token_path else mock.patch.object(last_token, "supports", return_value=False):
        scores = pooled(tokens, features, split)
    scores.square().sum().backward()
    return scores.detach(), {n: p.grad.clone() for n, p in pooled.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora_blocks, targets", [(1, ["q_proj", "v_proj"]), (1, ["k_proj", "v_proj", "up_proj"]),
                                                  (1, ["q_proj"]), (2, ["q_proj", "k_proj", "o_proj", "down_proj"]),
                                                  (3, ["up_proj"])])
@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("cached", [True, False])
def test_the_last_block_at_the_last_token_equals_the_whole_block(gqa_llama, lora_blocks, targets, padding, cached):
    backbone, tokenizer = gqa_llama
    pooled, split = model_with_lora(backbone, lora_blocks, targets)
    tokens = tokenize(tokenizer, TEXTS, 32)
    tokens = left_padded(tokens) if padding == "left" else tokens
    assert int(tokens.attention_mask.sum(1).min()) < tokens.attention_mask.shape[1]  # some rows are padded
    features, split = (pooled.lower_features(tokens, split), split) if cached and split else (None, 0)
    fast, fast_grads = scores_and_grads(pooled, tokens, features, split, True)
    whole, whole_grads = scores_and_grads(pooled, tokens, features, split, False)
    torch.testing.assert_close(fast, whole, rtol=0, atol=1e-10)
    assert fast_grads.keys() == whole_grads.keys() and len(fast_grads) == 2 * len(lora_layers(pooled)) + 2
    for name, grad in whole_grads.items():
        assert grad.abs().max() > 0, name  # every factor and the head gets a gradient
        torch.testing.assert_close(fast_grads[name], grad, rtol=0, atol=1e-10)
    assert len(layer_stack(pooled.backbone)[1]) == 3  # the blocks were put back


def test_the_last_block_runs_at_the_last_token_only(gqa_llama):
    """The MLP of the last block sees one row per text, the one below it every token."""
    backbone, tokenizer = gqa_llama
    pooled, split = model_with_lora(backbone, 2, ["q_proj"])
    tokens = tokenize(tokenizer, TEXTS, 32)
    blocks, seen = layer_stack(pooled.backbone)[1], {}
    hooks = [blocks[i].mlp.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, tuple(a[0].shape)))
             for i in (1, 2)]
    pooled(tokens, pooled.lower_features(tokens, split), split)
    for hook in hooks:
        hook.remove()
    assert seen == {1: (len(TEXTS), tokens.input_ids.shape[1], 32), 2: (len(TEXTS), 1, 32)}


def test_attention_dropout_in_training_runs_the_whole_block(gqa_llama):
    block = copy.deepcopy(gqa_llama[0].model.layers[-1])
    assert last_token.supports(block)
    block.self_attn.attention_dropout = 0.1
    assert last_token.supports(block.eval()) and not last_token.supports(block.train())


def test_the_last_blocks_cache_holds_its_frozen_keys_and_values(gqa_llama):
    """Cached at the last block: the states entering it, then its key and value projections before LoRA (2 key-value
    heads of 8: 16 columns each), the keys rotated; below it the states alone."""
    backbone, tokenizer = gqa_llama
    pooled, split = model_with_lora(backbone, 1, ["k_proj", "v_proj"])
    tokens = tokenize(tokenizer, TEXTS, 32)
    features = pooled.lower_features(tokens, split)
    top = layer_stack(pooled.backbone)[1][split]
    x = top.input_layernorm(features[..., :32])
    attn, n, t = top.self_attn, *tokens.input_ids.shape
    cos, sin = pooled.backbone.rotary_emb(x, torch.arange(t)[None])
    keys = attn.k_proj.base(x).view(n, t, 2, 8).transpose(1, 2)
    keys = keys * cos[:, None] + torch.cat([-keys[..., 4:], keys[..., :4]], -1) * sin[:, None]  # rotary, by hand
    torch.testing.assert_close(features[..., 32:], torch.cat([keys.transpose(1, 2).reshape(n, t, 16),
                                                              attn.v_proj.base(x)], -1))
    assert pooled.lower_features(tokens, split - 1).shape == (*tokens.input_ids.shape, 32)


def test_a_trained_key_projection_is_not_read_from_the_cache(gqa_llama):
    """If the last block's key weights train, its cached keys are stale: the scores are computed from the states."""
    backbone, tokenizer = gqa_llama
    pooled, split = model_with_lora(backbone, 1, ["q_proj"])
    tokens = tokenize(tokenizer, TEXTS, 32)
    features = pooled.lower_features(tokens, split)
    key = layer_stack(pooled.backbone)[1][split].self_attn.k_proj
    with torch.no_grad():
        key.weight.mul_(2.0)
    stale = pooled(tokens, features, split)
    key.weight.requires_grad_(True)
    torch.testing.assert_close(pooled(tokens, features, split), pooled(tokens), rtol=0, atol=1e-10)
    assert (stale - pooled(tokens)).abs().max() > 1e-3  # the check matters: the cache was stale
