"""Default LoRA targets per architecture (Hugging Face `config.model_type`), overridable wherever a config has
`lora.targets`. The attention projections, as PEFT's defaults and the papers use them."""

from __future__ import annotations

import re

from torch import nn

from collabalign.config import ConfigError, short
from collabalign.lora.inject import is_conv1d, matches

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ENCODER = ["query", "key", "value"]

DEFAULT_TARGETS: dict[str, list[str]] = {
    "llama": ATTENTION, "qwen2": ATTENTION, "qwen3": ATTENTION, "mistral": ATTENTION, "gemma": ATTENTION,
    "gemma2": ATTENTION, "phi3": ["qkv_proj", "o_proj"], "gpt2": ["c_attn"], "gpt_neox": ["query_key_value"],
    "bert": ENCODER, "roberta": ENCODER, "xlm-roberta": ENCODER, "distilbert": ["q_lin", "k_lin", "v_lin"],
    "deberta-v2": ["query_proj", "key_proj", "value_proj"], "electra": ENCODER,
}


def default_targets(model: nn.Module, targets: list[str] | None = None) -> list[str]:
    """`targets` when given (each must match a linear layer of `model`, as `inject.matches` matches), else the
    table's entry for the model's architecture; an architecture the table lacks is an error that says to set
    `lora.targets`."""
    if targets:
        linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) or is_conv1d(m)]
        for target in targets:
            try:
                re.compile(target)
            except re.error as err:
                raise ConfigError(f"lora.targets: {short(target)} is neither a layer name nor a pattern ({err})") \
                    from None
            if not any(matches(n, [target]) for n in linears):
                raise ConfigError(f"lora.targets: {short(target)} matches no linear layer of the model; its linear "
                                  f"layers include: {', '.join(linears[:8])}")
        return list(targets)
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in DEFAULT_TARGETS:
        raise ConfigError(f"no default LoRA targets for model type {kind!r}: set lora.targets to the names of its "
                         f"linear layers (known types: {', '.join(sorted(DEFAULT_TARGETS))})")
    return list(DEFAULT_TARGETS[kind])
