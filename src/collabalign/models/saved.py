"""Saved runs' adapters, both ways: building an entry point's adapters (`pooled_adapter`, `own_backbone`,
`base_prefix`) and scoring with a saved reward model or classifier loaded through `peft.PeftModel.from_pretrained`
(so what is scored is exactly what a PEFT user gets). A saved policy loads with `policy.saved.saved_policy`."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from collabalign.artifacts import Adapter, ArtifactError, adapter_dir, read_manifest, read_safetensors
from collabalign.config import ConfigError, cut
from collabalign.lora.peft_io import peft_adapter
from collabalign.models.backbones import Backbone, load_backbone
from collabalign.models.pooled import PooledModel, pool, tokenize


def adapter_files(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(PEFT config, LoRA tensors, head tensors or None) of one adapter folder; a missing or damaged file is an
    ArtifactError naming it."""
    file = folder / "adapter_config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ArtifactError(f"{file}: unreadable ({cut(str(err), 200)}); train again or restore it") from None
    if not isinstance(config, dict) or not isinstance(config.get("target_modules"), list) \
            or not isinstance(config.get("r"), int) or not isinstance(config.get("lora_alpha"), int | float):
        raise ArtifactError(f"{file}: not a LoRA adapter config (target_modules, r, lora_alpha); train again or "
                            "restore it")
    tensors = read_safetensors(folder / "adapter_model.safetensors", load_file)
    expected = {f"base_model.model.{t}.lora_{f}.weight" for t in config["target_modules"] for f in "AB"}
    if set(tensors) != expected or any(tensors[f"base_model.model.{t}.lora_A.weight"].shape[0] != config["r"]
                                       for t in config["target_modules"]):
        raise ArtifactError(f"{folder / 'adapter_model.safetensors'}: its tensors do not match adapter_config.json "
                            "(target_modules, r); train again or restore it")
    head = folder / "head.safetensors"
    return config, tensors, read_safetensors(head, load_file) if head.exists() else None


class SavedScorer:
    """Scores texts with a saved reward model or classifier: base model + PEFT adapter + score head, pooled as it was
    trained (the last real token of a causal LM, the mean over tokens of an encoder)."""

    def __init__(self, run: str | Path, name: str | None = None, backbone: Backbone | None = None):
        from peft import PeftModel

        manifest = read_manifest(run)
        if manifest["kind"] not in ("reward", "classifier"):
            raise ArtifactError(f"{run}: a {manifest['kind']} run has no score head; use `generate` for a policy")
        folder = adapter_dir(run, name)
        _, _, head = adapter_files(folder)
        if head is None or set(head) != {"weight", "bias"} or head["weight"].ndim != 2 \
                or head["bias"].shape != head["weight"].shape[:1]:
            raise ArtifactError(f"{folder / 'head.safetensors'}: missing or not a score head (weight (K, hidden), "
                                "bias (K,)); train again or restore it")
        backbone = backbone or load_backbone(manifest["base_model"])
        self.tokenizer, self.causal = backbone.tokenizer, backbone.causal
        try:
            with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5
                warnings.simplefilter("ignore", FutureWarning)
                self.model = PeftModel.from_pretrained(backbone.model, str(folder)).eval()
        except (RuntimeError, ValueError, KeyError) as err:  # target modules or shapes the base model lacks
            raise ArtifactError(f"{folder}: does not fit {manifest['base_model']} ({cut(str(err), 200)})") from None
        if head["weight"].shape[1] != backbone.model.config.hidden_size:
            raise ArtifactError(f"{folder / 'head.safetensors'}: {head['weight'].shape[1]} inputs, the base model "
                                f"gives {backbone.model.config.hidden_size}; train again or restore it")
        self.head_weight, self.head_bias = head["weight"], head["bias"]
        self.max_length = int(manifest.get("max_length", 512))

    @torch.no_grad()
    def __call__(self, texts: Sequence[str], second: Sequence[str] | None = None, batch_size: int = 32) -> np.ndarray:
        """Scores, shape (n,) for a reward model, (n, K) for a K-output classifier."""
        inner = self.model.base_model.model.base_model  # the transformer without its LM head
        out = []
        for start in range(0, len(texts), batch_size):
            part = None if second is None else second[start:start + batch_size]
            tokens = tokenize(self.tokenizer, texts[start:start + batch_size], self.max_length, part)
            hidden = inner(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
            pooled = pool(hidden, tokens.attention_mask, self.causal)
            out.append(pooled.float() @ self.head_weight.T + self.head_bias)
        scores = torch.cat(out).numpy()
        return scores[:, 0] if scores.shape[1] == 1 else scores


def own_backbone(model: Backbone | str | None, default: str, tokens: tuple[str, int] | None = None
                 ) -> tuple[Backbone, str]:
    """The backbone an entry point trains: loaded by name (`model`, else the config's `default`), or a deep copy of
    the one given (LoRA is injected in place; the caller's model stays bare). Returns it and its name. `tokens`
    (setting, count): how many tokens the config makes it read, a ConfigError past the model's positions."""
    if model is None or isinstance(model, str):
        name = model or default
        backbone = load_backbone(name)
    else:
        name = getattr(model.model.config, "_name_or_path", "") or default
        backbone = Backbone(copy.deepcopy(model.model), model.tokenizer, model.causal)
    positions = getattr(backbone.model.config, "max_position_embeddings", None)
    if tokens is not None and isinstance(positions, int) and tokens[1] > positions:
        raise ConfigError(f"{tokens[0]} = {tokens[1]}: {name} reads at most {positions} tokens")
    return backbone, name


def base_prefix(model: torch.nn.Module) -> str:
    """Where a Hugging Face model keeps its transformer (`base_model`): "model" in a LlamaForCausalLM, "" when the
    model is the transformer itself. Adapters trained on the transformer are saved under it."""
    prefix = getattr(model, "base_model_prefix", "")
    return prefix if prefix and getattr(model, prefix, None) is model.base_model else ""


def pooled_adapter(pooled: PooledModel, prefix: str, base_name: str, party: int | None = None,
                   head_rows: slice | int | None = None) -> Adapter:
    """A pooled model's LoRA (of `party`) and score head (all rows, or `head_rows` of a per-user head) as an
    Adapter."""
    tensors, config = peft_adapter(pooled.backbone, party, prefix, base_name)
    weight, bias = pooled.head.weight.detach(), pooled.head.bias.detach()
    if head_rows is not None:
        weight, bias = weight[head_rows].reshape(-1, weight.shape[-1]), bias[head_rows].reshape(-1)
    return Adapter(tensors, config, {"weight": weight, "bias": bias})
