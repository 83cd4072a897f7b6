"""LoRA reward models and classifiers on cached lower blocks, built one way for every reproduction.

`lora_top_blocks` puts LoRA into the top blocks of a pooled model and returns the split below them; `cache_texts`
tokenises texts once and runs the frozen blocks below the split once; `CachedModel` scores cached texts by row
index, so a training step costs only the LoRA blocks and the head."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from collabalign.lora.inject import inject_lora, lora_layers
from collabalign.models.pooled import PooledModel, Tokens, layer_stack, tokenize, top_block_targets


def lora_top_blocks(model: PooledModel, lora_blocks: int, targets: Sequence[str], rank: int,
                    alpha: float | None = None, dropout: float = 0.0) -> int:
    """LoRA on the linear layers `targets` of the top `lora_blocks` blocks (the whole backbone frozen); returns the
    number of blocks below them, which `cache_texts` may run once (0 when every block has LoRA)."""
    n_blocks = len(layer_stack(model.backbone)[1])
    lora_blocks = min(lora_blocks, n_blocks)
    inject_lora(model.backbone, top_block_targets(model.backbone, lora_blocks, list(targets)), rank, alpha,
                dropout=dropout)
    return n_blocks - lora_blocks


@dataclass
class TextCache:
    """Tokens of every text and the hidden states entering block `split` (CPU; None when split is 0, so the whole
    backbone runs each step; at a causal model's last block followed by its frozen keys and values, see
    `PooledModel.lower_features`)."""

    tokens: Tokens
    features: Tensor | None
    split: int

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, rows: Tensor) -> TextCache:
        return TextCache(self.tokens[rows], None if self.features is None else self.features[rows], self.split)

    @staticmethod
    def cat(caches: Sequence[TextCache]) -> TextCache:
        """The rows of every cache one after another, right-padded to the widest (their split must agree)."""
        width = max(c.tokens.input_ids.shape[1] for c in caches)
        fields = ("input_ids", "attention_mask") + (("token_type_ids",) if caches[0].tokens.token_type_ids is not None
                                                    else ())
        tokens = Tokens(*(torch.cat([F.pad(getattr(c.tokens, f), (0, width - c.tokens.input_ids.shape[1]))
                                     for c in caches]) for f in fields))
        features = None
        if caches[0].features is not None:  # one copy: each cache into its rows, zeros only in the padding
            features = caches[0].features.new_empty(len(tokens), width, caches[0].features.shape[-1])
            start = 0
            for c in caches:
                rows = features[start:start + len(c)]
                rows[:, : c.features.shape[1]] = c.features
                rows[:, c.features.shape[1]:] = 0
                start += len(c)
        return TextCache(tokens, features, caches[0].split)

    def batch(self, rows: Tensor, device: torch.device | str = "cpu") -> tuple[Tokens, Tensor | None]:
        """Tokens and features of `rows`, trimmed to their longest real text, on `device`."""
        rows = torch.as_tensor(rows).cpu()
        tokens = self.tokens[rows].trimmed()
        if self.features is None:
            return tokens.to(device), None
        return tokens.to(device), self.features[:, : tokens.input_ids.shape[1]].index_select(0, rows).to(device)


def cache_texts(model: PooledModel, tokenizer, texts: Sequence[str], max_length: int, split: int,
                second: Sequence[str] | None = None, truncation_side: str = "left", segments: bool = False
                ) -> TextCache:
    """Tokenises the texts (or text pairs with `second`, with segment ids when `segments`) and runs the frozen blocks
    below `split` once."""
    tokens = tokenize(tokenizer, texts, max_length, second, truncation_side, segments)
    return TextCache(tokens, model.lower_features(tokens, split) if split > 0 else None, split)


class CachedModel(nn.Module):
    """`pooled` applied to cached texts: the input is a tensor of row indices into `cache` (not in state_dict)."""

    def __init__(self, pooled: PooledModel, cache: TextCache):
        super().__init__()
        self.pooled, self.cache = pooled, cache

    def forward(self, rows: Tensor) -> Tensor:
        tokens, features = self.cache.batch(rows, self.pooled.head.weight.device)
        return self.pooled(tokens, features, self.cache.split)



@torch.no_grad()
def frozen_features(backbone: nn.Module, causal: bool, cache: TextCache, batch_size: int = 128) -> Tensor:
    """Every cached text's pooled hidden state of the frozen backbone (any LoRA in it switched off; pooled as the
    reward models and classifiers pool: mean for encoders, last real token for causal models), float32 on the CPU: a
    probe's inputs."""
    hidden = backbone.config.hidden_size
    pooled = PooledModel(backbone, causal, hidden, torch.Generator().manual_seed(0))
    pooled.head.weight.copy_(torch.eye(hidden, dtype=pooled.head.weight.dtype))  # the head passes the state through
    pooled.head.bias.zero_()
    model, rows = CachedModel(pooled, cache), torch.arange(len(cache))
    layers = lora_layers(backbone)
    enabled, training = {n: m.enabled for n, m in layers.items()}, backbone.training
    for layer in layers.values():
        layer.enabled = False
    backbone.eval()
    try:
        return torch.cat([model(rows[s:s + batch_size]).float().cpu() for s in range(0, len(rows), batch_size)])
    finally:
        for name, layer in layers.items():
            layer.enabled = enabled[name]
        backbone.train(training)
