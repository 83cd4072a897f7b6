"""A causal model's last block at one position per text: what a last-token-pooled score reads.

The score of a causal LM pooled at the last real token depends on the last block's output at that position alone.
There the keys and values still need every position, but the query, the attention output, the MLP and both norms
need only that one: for SmolLM2's block at 48 tokens that skips about 90% of the block's arithmetic, forward and
backward. The keys' and values' frozen projections (the keys rotated) can be computed once with the cached
features (`key_value_bases`): then a step pays only for their adapters, if any. Exact up to float rounding (the
tests check it in float64); applies to Llama-style blocks (`LlamaDecoderLayer`: SmolLM2, Llama, the tiny test
Llama); any other block runs whole."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, rotate_half

from collabalign.lora.layer import LoRALinear


def supports(block: nn.Module) -> bool:
    """Whether `block` can run at one position: a Llama block without attention dropout."""
    return isinstance(block, LlamaDecoderLayer) and not (block.training and block.self_attn.attention_dropout)


@torch.no_grad()
def key_value_bases(block: nn.Module, rotary: nn.Module, hidden: Tensor) -> Tensor | None:
    """The frozen key and value projections (N, T, 2 kv) of the states entering a Llama `block` (N, T, hidden),
    before their adapters, the keys rotated at positions 0..T-1 (still theirs when texts are cut on the right only,
    as `Tokens.trimmed` cuts); None for any other block."""
    if not isinstance(block, LlamaDecoderLayer):
        return None
    n, t, _ = hidden.shape
    x, heads = block.input_layernorm(hidden), _heads(block.self_attn, n, t)
    keys = _rotate(heads(_base(block.self_attn.k_proj)(x)), *_cos_sin(rotary, hidden))
    return torch.cat([keys.transpose(1, 2).reshape(n, t, -1), _base(block.self_attn.v_proj)(x)], -1)


def block_at(block: LlamaDecoderLayer, rotary: nn.Module, hidden: Tensor, mask: Tensor, last: Tensor,
             kv_bases: Tensor | None = None) -> Tensor:
    """The block's output (N, hidden) at position `last` (N,) of each row, from the states entering it (N, T, hidden)
    and the attention mask (N, T); positions are 0..T-1, as the Hugging Face model numbers them. With `kv_bases`
    (from `key_value_bases`, used while those projections and the norm before them stay frozen) the keys and values
    add only their adapters' updates."""
    n, t, _ = hidden.shape
    attn, rows, heads = block.self_attn, torch.arange(n, device=hidden.device), _heads(block.self_attn, n, t)
    cos, sin = _cos_sin(rotary, hidden)
    if kv_bases is not None and not _frozen(block):
        kv_bases = None  # a trained projection or norm: the cached bases are stale
    adapted = kv_bases is None or _adapted(attn.k_proj) or _adapted(attn.v_proj)
    x = block.input_layernorm(hidden) if adapted else None
    if kv_bases is None:
        keys, values = _rotate(heads(attn.k_proj(x)), cos, sin), heads(attn.v_proj(x))
    else:
        k_base, v_base = kv_bases.chunk(2, -1)
        keys, values = heads(k_base), heads(_with_update(attn.v_proj, x, v_base))
        if _adapted(attn.k_proj):  # the cached keys are rotated: the update is rotated apart (the rotation is linear)
            keys = keys + _rotate(heads(attn.k_proj.add_update(x, k_base.new_zeros(n * t, k_base.shape[-1]))), cos, sin)
    at_last = x[rows, last] if x is not None else block.input_layernorm(hidden[rows, last])
    query = attn.q_proj(at_last[:, None]).view(n, 1, -1, attn.head_dim)
    query = _rotate(query.transpose(1, 2), cos[0, 0, last][:, None, None], sin[0, 0, last][:, None, None])
    seen = mask.bool() & (torch.arange(t, device=hidden.device)[None] <= last[:, None])
    out = F.scaled_dot_product_attention(query, keys, values, attn_mask=seen[:, None, None], scale=attn.scaling,
                                         enable_gqa=attn.num_key_value_groups > 1)
    h = hidden[rows, last][:, None] + attn.o_proj(out.transpose(1, 2).reshape(n, 1, -1))
    return (h + block.mlp(block.post_attention_layernorm(h)))[:, 0]


def _frozen(block: LlamaDecoderLayer) -> bool:
    """Whether what `key_value_bases` computes stays fixed: the keys' and values' bases and the norm before them."""
    modules = (_base(block.self_attn.k_proj), _base(block.self_attn.v_proj), block.input_layernorm)
    return not any(p.requires_grad for m in modules for p in m.parameters())


def _base(projection: nn.Module) -> nn.Module:
    return projection.base if isinstance(projection, LoRALinear) else projection


def _adapted(projection: nn.Module) -> bool:
    return isinstance(projection, LoRALinear) and projection.enabled


def _with_update(projection: nn.Module, x: Tensor | None, base: Tensor) -> Tensor:
    """The projection's output from its frozen part `base` (N, T, out): plus its adapter's update on x, if any."""
    if not _adapted(projection):
        return base
    return projection.add_update(x, base.reshape(-1, base.shape[-1]).clone())  # the cache is never written


def _heads(attn: nn.Module, n: int, t: int):
    """(N, T, heads * head_dim) -> (N, heads, T, head_dim)."""
    return lambda z: z.reshape(n, t, -1, attn.head_dim).transpose(1, 2)


def _cos_sin(rotary: nn.Module, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """The rotary embedding at positions 0..T-1, shaped (1, 1, T, head_dim) for (N, heads, T, head_dim)."""
    cos, sin = rotary(hidden, torch.arange(hidden.shape[1], device=hidden.device)[None])
    return cos[:, None], sin[:, None]


def _rotate(z: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return z * cos + rotate_half(z) * sin
