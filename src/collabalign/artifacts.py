"""What a method's entry point returns: the adapters it trained (each a PEFT LoRA folder, with a score head when the
model scores), other trained arrays, its metrics, and a manifest (method, base model, config, data hash).

    run/manifest.json
    run/adapters/<name>/adapter_config.json, adapter_model.safetensors   <- peft.PeftModel.from_pretrained(base, path)
    run/adapters/<name>/head.safetensors                                  <- score head: weight (K, hidden), bias (K,)
    run/arrays.safetensors                                                <- e.g. AffPCL's per-agent solutions
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file
from torch import Tensor

from collabalign import __version__
from collabalign.lora.peft_io import write_peft

MANIFEST = "manifest.json"
# what an adapter is for: scoring texts (a reward model: one output; a classifier or regressor: K outputs), or
# generating (a policy); "arrays" results hold no adapter
Kind = Literal["reward", "classifier", "policy", "arrays"]


class ArtifactError(ValueError):
    """A run folder that holds no usable result (missing or malformed manifest, unknown adapter)."""


@dataclass
class Adapter:
    """One trained adapter: PEFT-keyed LoRA tensors and config (`lora.peft_io.peft_adapter`), and its score head."""

    tensors: dict[str, Tensor]
    config: dict
    head: dict[str, Tensor] | None = None

    def save(self, path: Path) -> Path:
        write_peft(path, self.tensors, self.config)
        if self.head is not None:
            save_file({k: v.detach().float().contiguous().clone() for k, v in self.head.items()},
                      str(path / "head.safetensors"))
        return path


@dataclass
class Result:
    """A method's trained output. `config` is the entry point's config as a dict; `data_hash` the sha256 of the
    data it trained on; `metrics` what it measured (training loss, held-out scores)."""

    method: str
    kind: Kind
    base_model: str
    config: dict[str, Any]
    data_hash: str
    metrics: dict[str, Any]
    adapters: dict[str, Adapter] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    max_length: int = 512  # tokens per scored text, as trained
    model: Any = field(default=None, repr=False)  # the trained torch module, in memory only (never saved)

    def manifest(self) -> dict[str, Any]:
        return {"method": self.method, "kind": self.kind, "base_model": self.base_model, "config": self.config,
                "data_hash": self.data_hash, "metrics": self.metrics, "adapters": sorted(self.adapters),
                "arrays": sorted(self.arrays), "max_length": self.max_length, "collabalign": __version__}

    def save(self, path: str | Path) -> Path:
        """Writes the run folder (see the module doc); returns it."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for name, adapter in self.adapters.items():
            adapter.save(path / "adapters" / name)
        if self.arrays:
            save_numpy({k: np.ascontiguousarray(v) for k, v in self.arrays.items()}, str(path / "arrays.safetensors"))
        (path / MANIFEST).write_text(json.dumps(self.manifest(), indent=1, default=_plain) + "\n")
        return path


def _plain(value: Any) -> Any:
    """JSON for numpy scalars and arrays in metrics."""
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else str(value)


def read_manifest(path: str | Path) -> dict[str, Any]:
    """A saved run's manifest; a folder without a readable one is an ArtifactError naming it."""
    file = Path(path) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no {MANIFEST}: not a folder a method's entry point saved") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{file}: unreadable ({err})") from None
    if not isinstance(manifest, dict) or not {"method", "kind", "base_model", "adapters"} <= set(manifest):
        raise ArtifactError(f"{file}: not a collabalign manifest")
    return manifest


def adapter_dir(path: str | Path, name: str | None = None) -> Path:
    """The folder of adapter `name` (optional when the run saved exactly one, or one called "global")."""
    names = read_manifest(path)["adapters"]
    if name is None:
        if len(names) == 1 or "global" in names:
            name = names[0] if len(names) == 1 else "global"
        else:
            raise ArtifactError(f"{path}: {len(names)} adapters, name one of: {', '.join(names[:20])}")
    if name not in names:
        raise ArtifactError(f"{path}: no adapter {name!r}; saved: {', '.join(names[:20]) or 'none'}")
    return Path(path) / "adapters" / name


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """A saved run's other arrays (empty when it has none)."""
    file = Path(path) / "arrays.safetensors"
    return load_numpy(str(file)) if file.exists() else {}
