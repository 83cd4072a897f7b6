"""Export one party's adapter in PEFT's LoRA format (adapter_config.json + adapter_model.safetensors),
loadable by ``peft.PeftModel.from_pretrained(base, path)`` with identical outputs."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor, nn

from collabalign.lora.inject import lora_layers
from collabalign.runs import atomic_write_bytes, atomic_write_text


def peft_adapter(model: nn.Module, party: int | None = None, prefix: str = "", base_model_name: str = "",
                 task_type: str | None = None) -> tuple[dict[str, Tensor], dict]:
    """(tensors, adapter config) of `party`'s adapter (required when any factor is per-party) at full rank (or the
    layers' routed rank subset). `prefix`: the path of `model` inside the base model a user loads (Hugging Face's
    `base_model_prefix`, e.g. "model" when LoRA sits in a LlamaForCausalLM's inner LlamaModel)."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("model has no LoRA layers to export")
    ranks = {m.active_rank for m in layers.values()}
    alphas = {m.scale * m.active_rank for m in layers.values()}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ValueError(f"PEFT export needs one rank and alpha for all layers, got ranks {ranks}, alphas {alphas}")
    tensors, names = {}, []
    for name, layer in layers.items():
        if (layer.per_party_a or layer.per_party_b) and party is None:
            raise ValueError(f"layer {name} has per-party factors: pass party=")
        A, B = layer.factors(party)
        full = f"{prefix}.{name}" if prefix else name
        names.append(full)
        tensors[f"base_model.model.{full}.lora_A.weight"] = A.detach().to(torch.float32).contiguous().clone()
        tensors[f"base_model.model.{full}.lora_B.weight"] = B.detach().to(torch.float32).contiguous().clone()
    config = {
        "peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": base_model_name,
        "r": ranks.pop(), "lora_alpha": alphas.pop(), "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(names),
        "fan_in_fan_out": any(getattr(m.base, "fan_in_fan_out", False) for m in layers.values()),
        "inference_mode": True, "modules_to_save": None, "init_lora_weights": True, "use_rslora": False,
        "use_dora": False,
    }
    return tensors, config


def write_peft(path: str | Path, tensors: dict[str, Tensor], config: dict) -> Path:
    """Writes an adapter folder from `peft_adapter`'s output (each file atomically, as readable as any other)."""
    path = Path(path)
    atomic_write_text(path / "adapter_config.json", json.dumps(config, indent=2))
    atomic_write_bytes(path / "adapter_model.safetensors", safetensors.torch.save(tensors))
    return path


def save_peft(model: nn.Module, path: str | Path, party: int | None = None, base_model_name: str = "",
              task_type: str | None = None, prefix: str = "") -> Path:
    """Writes the adapter of `party` as a PEFT folder (see `peft_adapter`)."""
    return write_peft(path, *peft_adapter(model, party, prefix, base_model_name, task_type))
