"""A causal model's last block at one position per text: what a last-token-pooled score reads.

The score of a causal LM pooled at the last real token depends on the last block's output at that position alone.
There the keys and values still need every position, but the query, the attention output, the MLP and both norms
need only that one: for SmolLM2's block at 48 tokens that skips about 90% of the block's arithmetic, forward and
backward. Exact up to float rounding (the tests check it in float64); applies to Llama-style blocks
(`LlamaDecoderLayer`: SmolLM2, Llama, the tiny test Llama); any other block runs whole."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, rotate_half


def supports(block: nn.Module) -> bool:
    """Whether `block` can run at one position: a Llama block without attention dropout."""
    return isinstance(block, LlamaDecoderLayer) and not (block.training and block.self_attn.attention_dropout)


def block_at(block: LlamaDecoderLayer, rotary: nn.Module, hidden: Tensor, mask: Tensor, last: Tensor) -> Tensor:
    """The block's output (N, hidden) at position `last` (N,) of each row, from the states entering it (N, T, hidden)
    and the attention mask (N, T); positions are 0..T-1, as the Hugging Face model numbers them."""
    n, t, _ = hidden.shape
    attn, rows = block.self_attn, torch.arange(n, device=hidden.device)
    positions = torch.arange(t, device=hidden.device)
    x = block.input_layernorm(hidden)
    cos, sin = rotary(hidden, positions[None])  # (1, T, head_dim)
    heads = (n, t, -1, attn.head_dim)
    keys = _rotate(attn.k_proj(x).view(heads).transpose(1, 2), cos[:, None], sin[:, None])
    values = attn.v_proj(x).view(heads).transpose(1, 2)
    query = attn.q_proj(x[rows, last][:, None]).view(n, 1, -1, attn.head_dim).transpose(1, 2)
    query = _rotate(query, cos[0, last][:, None, None], sin[0, last][:, None, None])
    seen = mask.bool() & (positions[None] <= last[:, None])
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=seen[:, None, None], scale=attn.scaling,
                                         enable_gqa=attn.num_key_value_groups > 1)
    h = hidden[rows, last][:, None] + attn.o_proj(out.transpose(1, 2).reshape(n, 1, -1))
    return (h + block.mlp(block.post_attention_layernorm(h)))[:, 0]


def _rotate(z: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return z * cos + rotate_half(z) * sin
