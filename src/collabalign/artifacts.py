"""What a method's entry point returns: the adapters it trained (each a PEFT LoRA folder, with a score head when the
model scores), other trained arrays, its metrics, and a manifest (method, base model, config, data hash).

    run/manifest.json
    run/adapters/<name>/adapter_config.json, adapter_model.safetensors   <- peft.PeftModel.from_pretrained(base, path)
    run/adapters/<name>/head.safetensors                                  <- score head: weight (K, hidden), bias (K,)
    run/arrays.safetensors                                                <- e.g. AffPCL's per-agent solutions
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import safetensors.numpy
import safetensors.torch
from safetensors import SafetensorError
from torch import Tensor

from collabalign import __version__
from collabalign.config import cut, short
from collabalign.data.names import inside
from collabalign.lora.peft_io import write_peft
from collabalign.runs import atomic_write_bytes, atomic_write_text

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
            head = {k: v.detach().float().contiguous().clone() for k, v in self.head.items()}
            atomic_write_bytes(path / "head.safetensors", safetensors.torch.save(head))
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
        """Writes the run folder (see the module doc), each file atomically and the manifest last, so a folder with a
        manifest holds a whole result; returns it. Every adapter's folder is checked to be a name inside `adapters/`
        before anything is written."""
        path = Path(path)
        folders = {name: inside(path / "adapters", name) for name in self.adapters}
        for name, adapter in self.adapters.items():
            adapter.save(folders[name])
        if self.arrays:
            arrays = {k: np.ascontiguousarray(v) for k, v in self.arrays.items()}
            atomic_write_bytes(path / "arrays.safetensors", safetensors.numpy.save(arrays))
        atomic_write_text(path / MANIFEST, json.dumps(self.manifest(), indent=1, default=_plain) + "\n")
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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ArtifactError(f"{file}: unreadable ({cut(str(err), 200)})") from None
    if not isinstance(manifest, dict) or not {"method", "kind", "base_model", "adapters"} <= set(manifest):
        raise ArtifactError(f"{file}: not a collabalign manifest")
    length = manifest.get("max_length", 512)
    if manifest["kind"] not in get_args(Kind) or not isinstance(manifest["base_model"], str) \
            or not isinstance(manifest["adapters"], list) or not all(isinstance(n, str) for n in manifest["adapters"]) \
            or isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ArtifactError(f"{file}: damaged (kind, base_model, adapters or max_length is not as saved); train "
                            "again or restore it")
    return manifest


def adapter_dir(path: str | Path, name: str | None = None) -> Path:
    """The folder of adapter `name` (optional when the run saved exactly one, or one called "global"); an unknown
    name, or a manifest listing a name that is not a folder inside `adapters/`, is an ArtifactError."""
    names = read_manifest(path)["adapters"]
    if name is None:
        if len(names) == 1 or "global" in names:
            name = names[0] if len(names) == 1 else "global"
        else:
            raise ArtifactError(f"{path}: {len(names)} adapters, name one of: {', '.join(names[:20])}")
    if name not in names:
        raise ArtifactError(f"{path}: no adapter {short(name)}; saved: {', '.join(names[:20]) or 'none'}")
    try:
        folder = inside(Path(path) / "adapters", name)
    except ValueError as err:
        raise ArtifactError(f"{Path(path) / MANIFEST}: adapter {err}") from None
    if not folder.is_dir():
        raise ArtifactError(f"{folder}: missing (the run folder is damaged; train again or restore it)")
    return folder


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """A saved run's other arrays (empty when it has none)."""
    file = Path(path) / "arrays.safetensors"
    return read_safetensors(file, safetensors.numpy.load_file) if file.exists() else {}


def read_safetensors(file: Path, load: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """`load(file)`; a missing, unreadable or damaged file is an ArtifactError naming it."""
    try:
        return load(str(file))
    except FileNotFoundError:
        raise ArtifactError(f"{file}: missing (the run folder is damaged; train again or restore it)") from None
    except (OSError, SafetensorError) as err:
        raise ArtifactError(f"{file}: unreadable ({cut(str(err), 200)}); train again or restore it") from None
