"""A transformer backbone (+ LoRA) pooled into a linear head, with an optional cache of the frozen lower blocks'
hidden states, so training LoRA in the top blocks costs only those blocks. Reward models and sequence
classifiers are both this."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from collabalign.config import ConfigError
from collabalign.data.limits import cut_texts
from collabalign.models import last_token


@dataclass
class Tokens:
    """Right-padded token ids and attention mask for a list of texts; for text pairs tokenised with `segments`, the
    segment ids too (0 for the first text, 1 for the second, as BERT-like encoders were pre-trained)."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor | None = None

    def __getitem__(self, rows) -> Tokens:
        types = None if self.token_type_ids is None else self.token_type_ids[rows]
        return Tokens(self.input_ids[rows], self.attention_mask[rows], types)

    def __len__(self) -> int:
        return len(self.input_ids)

    def trimmed(self) -> Tokens:
        """Cut to the longest real text (right padding), so a batch pays only for the tokens it has."""
        return self[:, : int(self.attention_mask.sum(1).max())]

    def to(self, device: torch.device | str) -> Tokens:
        types = None if self.token_type_ids is None else self.token_type_ids.to(device)
        return Tokens(self.input_ids.to(device), self.attention_mask.to(device), types)

    def inputs(self) -> dict[str, Tensor]:
        """The backbone's keyword inputs: ids, mask and (when set) segment ids."""
        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask}
        return out if self.token_type_ids is None else {**out, "token_type_ids": self.token_type_ids}


def tokenize(tokenizer, texts: Sequence[str], max_length: int, second: Sequence[str] | None = None,
             truncation_side: str = "left", segments: bool = False) -> Tokens:
    """Right-padded tokens of `texts` (or of text pairs with `second`). Left truncation (the default) keeps the
    end of a dialogue, where the judged reply is. `segments`: text pairs keep the tokenizer's segment ids (when it
    makes them), so the second text is segment 1. Texts are cut to what `max_length` tokens can hold first
    (`data.limits.cut_texts`: the same tokens, bounded work)."""
    tokenizer.truncation_side = truncation_side
    tokenizer.padding_side = "right"
    keep = "end" if truncation_side == "left" else "start"
    enc = tokenizer(cut_texts(texts, max_length, keep), cut_texts(second, max_length, keep), truncation=True,
                    max_length=max_length, padding=True, return_tensors="pt")
    types = enc.get("token_type_ids") if segments and second is not None else None
    return Tokens(enc["input_ids"], enc["attention_mask"], types)


def layer_stack(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The name and list of the transformer's blocks (BERT `encoder.layer`, Llama `layers`, GPT-2 `h`, ...)."""
    n = model.config.num_hidden_layers
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return name, module
    raise ValueError(f"{type(model).__name__}: no ModuleList of {n} blocks found")


def top_block_targets(model: nn.Module, n_blocks: int, names: Sequence[str]) -> list[str]:
    """inject_lora targets (one regex) for the linear layers called `names` in the top `n_blocks` blocks."""
    stack, blocks = layer_stack(model)
    if not 0 < n_blocks <= len(blocks):
        raise ConfigError(f"lora.blocks = {n_blocks}: the model has {len(blocks)} blocks (1..{len(blocks)})")
    top = "|".join(str(i) for i in range(len(blocks) - n_blocks, len(blocks)))
    return [rf"{re.escape(stack)}\.({top})\.(.*\.)?({'|'.join(map(re.escape, names))})"]


class _Passthrough(nn.Module):
    def forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:
        return hidden_states


class _Stop(Exception):
    pass


class PooledModel(nn.Module):
    """head(pool(h(x))): mean over tokens for encoders, last real token for causal models; `outputs` scores. A causal
    model's last block runs at the last real token only where it can (`last_token`)."""

    def __init__(self, backbone: nn.Module, causal: bool, outputs: int, generator: torch.Generator | None = None):
        super().__init__()
        self.backbone = backbone.base_model  # hidden states, without any LM head
        self.causal = causal
        hidden = backbone.config.hidden_size
        self.head = nn.Linear(hidden, outputs)
        with torch.no_grad():
            self.head.weight.copy_(torch.randn(outputs, hidden, generator=generator) / hidden**0.5)
            self.head.bias.zero_()

    def pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        return pool(hidden, mask, self.causal)

    def forward(self, tokens: Tokens, features: Tensor | None = None, split: int = 0) -> Tensor:
        """Scores, shape (batch, outputs). With `features` (from `lower_features(tokens, split)`), blocks below `split`
        are skipped and their cached output is fed to block `split`."""
        blocks = layer_stack(self.backbone)[1]
        top, width = blocks[-1], self.backbone.config.hidden_size
        kv_bases = None
        if features is not None and features.shape[-1] > width:  # the top block's key and value bases follow
            features, kv_bases = features[..., :width], features[..., width:]
        if self.causal and last_token.supports(top):
            cached = features is not None and split == len(blocks) - 1
            hidden = features if cached else self._entering(top, tokens, features, split)
            mask = tokens.attention_mask
            final = last_token.block_at(top, self.backbone.rotary_emb, hidden, mask, last_real(mask), kv_bases)
            return self.head(self.backbone.norm(final))
        with self._from_features(features, split):
            out = self.backbone(**tokens.inputs())
        return self.head(self.pool(out.last_hidden_state, tokens.attention_mask))

    @torch.no_grad()
    def lower_features(self, tokens: Tokens, split: int, batch_size: int = 64) -> Tensor:
        """Hidden states entering block `split` (0 < split < n_blocks), computed once; valid while blocks
        below `split` stay frozen (LoRA only in the blocks from `split` up). When `split` is a causal model's
        last Llama block, its frozen key and value projections follow along the last dimension
        (`last_token.key_value_bases`): a step then computes only their adapters."""
        _, blocks = layer_stack(self.backbone)
        if not 0 < split < len(blocks):
            raise ValueError(f"split must be in 1..{len(blocks) - 1}, got {split}")
        device = self.head.weight.device  # the features are kept on the CPU: the cache can outgrow device memory
        return torch.cat([self._frozen_part(blocks, split, tokens[start:start + batch_size].to(device)).cpu()
                          for start in range(0, len(tokens), batch_size)])

    def _frozen_part(self, blocks: nn.ModuleList, split: int, tokens: Tokens) -> Tensor:
        hidden = self._entering(blocks[split], tokens)
        if not (self.causal and split == len(blocks) - 1):
            return hidden
        kv_bases = last_token.key_value_bases(blocks[split], self.backbone.rotary_emb, hidden)
        return hidden if kv_bases is None else torch.cat([hidden, kv_bases], -1)

    def _entering(self, block: nn.Module, tokens: Tokens, features: Tensor | None = None, split: int = 0) -> Tensor:
        """The hidden states entering `block`: the backbone run (from `features` at block `split`) up to it."""
        captured: list[Tensor] = []

        def capture(module, args, kwargs):
            captured.append(args[0] if args else kwargs["hidden_states"])
            raise _Stop

        handle = block.register_forward_pre_hook(capture, with_kwargs=True)
        try:
            with self._from_features(features, split):
                self.backbone(**tokens.inputs())
        except _Stop:
            pass
        finally:
            handle.remove()
        return captured[0]

    @contextmanager
    def _from_features(self, features: Tensor | None, split: int) -> Iterator[None]:
        if features is None:
            yield
            return
        _, blocks = layer_stack(self.backbone)
        lower = [blocks[i] for i in range(split)]

        def inject(module, args, kwargs):
            if args:
                return (features, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": features}

        handle = blocks[split].register_forward_pre_hook(inject, with_kwargs=True)
        for i in range(split):
            blocks[i] = _Passthrough()
        try:
            yield
        finally:
            handle.remove()
            for i, block in enumerate(lower):
                blocks[i] = block


def pool(hidden: Tensor, mask: Tensor, causal: bool) -> Tensor:
    """The last real token's state for a causal model, the mean over real tokens for an encoder."""
    if causal:
        return hidden[torch.arange(len(hidden)), last_real(mask)]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1)


def last_real(mask: Tensor) -> Tensor:
    """The index of each row's last real token (left or right padding)."""
    return mask.shape[1] - 1 - mask.flip(1).argmax(1)
