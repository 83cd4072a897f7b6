"""A saved run's policy adapter (a PEFT folder on a causal LM) loaded into a `Policy`, for generation."""

from __future__ import annotations

from pathlib import Path

from collabalign.artifacts import ArtifactError, adapter_dir, read_manifest
from collabalign.config import cut
from collabalign.models.backbones import Backbone, load_backbone
from collabalign.models.saved import adapter_files
from collabalign.policy.model import Policy


def saved_policy(run: str | Path, name: str | None = None, backbone: Backbone | None = None) -> Policy:
    """A `Policy` on the run's base model with the saved policy adapter loaded."""
    manifest = read_manifest(run)
    if manifest["kind"] != "policy":
        raise ArtifactError(f"{run}: a {manifest['kind']} run holds no policy; use `score`")
    folder = adapter_dir(run, name)
    config, tensors, _ = adapter_files(folder)
    backbone = backbone or load_backbone(manifest["base_model"])
    names = config["target_modules"]
    state = {f"{n}.{f}": tensors[f"base_model.model.{n}.lora_{f}.weight"].numpy() for n in names for f in "AB"}
    try:
        policy = Policy(backbone, list(names), config["r"], config["lora_alpha"], 0.0)  # exact names match
        policy.load_adapter_state(state)
    except ValueError as err:  # target modules or shapes the base model lacks
        raise ArtifactError(f"{folder}: does not fit {manifest['base_model']} ({cut(str(err), 200)})") from None
    return policy
