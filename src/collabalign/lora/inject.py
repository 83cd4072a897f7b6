"""Puts `LoRALinear` into any torch / Hugging Face module by target names, and routes parties and ranks."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from collabalign.config import ConfigError, short
from collabalign.lora.layer import LoRALinear, Party


def matches(name: str, targets: list[str]) -> bool:
    """A module name matches a target if equal, if it ends with '.target', or if the target regex fullmatches it."""
    return any(name == t or name.endswith("." + t) or re.fullmatch(t, name) for t in targets)


def inject_lora(model: nn.Module, targets: list[str], rank: int, alpha: float | None = None,
                parties_a: int | None = None, parties_b: int | None = None, dropout: float = 0.0,
                generator: torch.Generator | None = None) -> dict[str, LoRALinear]:
    """Replaces every nn.Linear (or GPT-2 Conv1D) whose name matches `targets` with a LoRALinear; freezes the whole
    base model.

    Returns {module name: layer} in model order. Raises if nothing matched, listing some linear names.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) or is_conv1d(m)]
    chosen = [(n, as_linear(m)) for n, m in linears if matches(n, targets)]
    if not chosen:
        sample = ", ".join(n for n, _ in linears[:8])
        raise ConfigError(f"lora.targets = {short(targets)}: no linear layer of the model matches; its linear layers "
                          f"include: {sample}")
    layers = {}
    for name, linear in chosen:
        layer = LoRALinear(linear, rank, alpha, parties_a, parties_b, dropout)
        layer.reset_parameters(generator)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        layers[name] = layer
    return layers


def is_conv1d(module: nn.Module) -> bool:
    """GPT-2's `Conv1D`: a linear map stored transposed (weight (in, out))."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def as_linear(module: nn.Module) -> nn.Linear:
    """The module as an nn.Linear: itself, or a Conv1D's transposed weight (a view, no copy) and bias."""
    if not is_conv1d(module):
        return module
    linear = nn.Linear(module.weight.shape[0], module.weight.shape[1], device="meta")
    linear.weight = nn.Parameter(module.weight.detach().T, requires_grad=False)
    linear.bias = nn.Parameter(module.bias.detach(), requires_grad=False)
    linear.fan_in_fan_out = True  # PEFT's flag for such layers, carried into the adapter config
    return linear


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """{name: LoRALinear} for every injected layer, in model order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_parameters(model: nn.Module) -> dict[str, Tensor]:
    """{'<layer>.A': A, '<layer>.B': B} for every LoRA layer (the trainable adapter state)."""
    out = {}
    for name, layer in lora_layers(model).items():
        out[f"{name}.A"] = layer.A
        out[f"{name}.B"] = layer.B
    return out


@contextmanager
def routed(model: nn.Module, party: Party = None,
           rank_idx: Tensor | dict[str, Tensor] | None = None) -> Iterator[None]:
    """Within the block every LoRA layer uses `party` and `rank_idx` (one subset, or one per layer name)."""
    layers = lora_layers(model)
    before = {n: (m.party, m.rank_idx) for n, m in layers.items()}
    for name, layer in layers.items():
        layer.route(party, rank_idx.get(name) if isinstance(rank_idx, dict) else rank_idx)
    try:
        yield
    finally:
        for name, layer in layers.items():
            layer.route(*before[name])
