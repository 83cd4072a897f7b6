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

from collabalign.artifacts import Adapter, ArtifactError, adapter_dir, read_manifest
from collabalign.lora.peft_io import peft_adapter
from collabalign.models.backbones import Backbone, load_backbone
from collabalign.models.pooled import PooledModel, pool, tokenize


def adapter_files(folder: Path) -> tuple[dict, dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
    """(PEFT config, LoRA tensors, head tensors or None) of one adapter folder."""
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    head = folder / "head.safetensors"
    return config, tensors, load_file(str(head)) if head.exists() else None


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
        if head is None:
            raise ArtifactError(f"{folder}: no head.safetensors")
        backbone = backbone or load_backbone(manifest["base_model"])
        self.tokenizer, self.causal = backbone.tokenizer, backbone.causal
        with warnings.catch_warnings():  # peft calls a transformers property deprecated in v5
            warnings.simplefilter("ignore", FutureWarning)
            self.model = PeftModel.from_pretrained(backbone.model, str(folder)).eval()
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


def own_backbone(model: Backbone | str | None, default: str) -> tuple[Backbone, str]:
    """The backbone an entry point trains: loaded by name (`model`, else the config's `default`), or a deep copy of
    the one given (LoRA is injected in place; the caller's model stays bare). Returns it and its name."""
    if model is None or isinstance(model, str):
        name = model or default
        return load_backbone(name), name
    name = getattr(model.model.config, "_name_or_path", "") or default
    return Backbone(copy.deepcopy(model.model), model.tokenizer, model.causal), name


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
