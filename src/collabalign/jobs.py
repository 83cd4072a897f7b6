"""Federated jobs by method, from a deployment config: what `collabalign deploy` and the Flower app (`app.py`) run.

A deployment config is a YAML file naming `train` (a federated method: `registry.FEDERATED`), `data` (its data file
in the method's format, relative to the config's folder; `example` for the shipped example file of that format) and the
method's own settings, as `collabalign train METHOD --config` reads them (its `engine` and `aggregation` sections
included), e.g. configs/deploy/fedavg-lora.yaml. The ServerApp and every ClientApp build the same job from it
(`build`), so a setting holds on a deployment exactly as in the simulator.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabalign.config import ConfigError, apply_overrides, read_yaml, short, validate
from collabalign.federation.job import FederatedJob
from collabalign.registry import FEDERATED

EXAMPLE = "example"  # `data: example`: the shipped example file of the method's format
DEFAULT_CONFIG = Path(__file__).parent / "configs" / "deploy" / "fedavg-lora.yaml"  # a run config's config ""


@dataclass(frozen=True)
class JobSpec:
    """A validated deployment config: the method, its config object and the data file."""

    method: str
    config: Any
    data: Path


def read_spec(path: str | Path, overrides: list[str] = ()) -> JobSpec:
    """The deployment config at `path` with dotted `overrides`; a bad one is a ConfigError naming the file and key."""
    path = Path(path)
    values = apply_overrides(read_yaml(path), list(overrides))
    method, data = values.pop("train", None), values.pop("data", None)
    if not isinstance(method, str) or method not in FEDERATED:
        raise ConfigError(f"{path}: train = {short(method)}: must be one of {', '.join(FEDERATED)} (a deployment "
                          "config: `collabalign list` shows them)")
    if not isinstance(data, str) or not data:
        raise ConfigError(f"{path}: data = {short(data)}: must be a data file (relative to the config's folder) or "
                          f"{EXAMPLE!r}")
    entry = FEDERATED[method]
    config = validate(getattr(importlib.import_module(entry.module), entry.config), values, str(path))
    file = example_file(entry.data) if data == EXAMPLE else (path.parent / data).resolve()
    if not file.is_file():
        raise ConfigError(f"{path}: data = {short(data)}: no such file ({file})")
    if getattr(config, "lr", None) == "auto":
        raise ConfigError(f"{path}: lr = auto: chosen by training in process (collabalign train); a deployment's "
                          "server and nodes need a number, e.g. lr: 0.001")
    return JobSpec(method, config, file)


def spec_of(run_config: dict[str, Any]) -> JobSpec:
    """The deployment config a Flower run config names (``config``; "" = `DEFAULT_CONFIG`) with its ``overrides``
    (dotted, separated by ";")."""
    path = str(run_config.get("config", "")) or str(DEFAULT_CONFIG)
    overrides = [o.strip() for o in str(run_config.get("overrides", "")).split(";") if o.strip()]
    return read_spec(path, overrides)


def job_key(spec: JobSpec) -> str:
    """What identifies a job's run across restarts: method, settings and the data's bytes."""
    from collabalign.data.formats import file_hash
    from collabalign.runs import fingerprint

    return fingerprint({"method": spec.method, "config": spec.config.model_dump(mode="json"),
                        "data": file_hash(spec.data)})


def with_node_settings(spec: JobSpec, clients: list[str], declared: dict[str, dict[str, Any]]) -> JobSpec:
    """The spec with what each client's node declared in its node config (FSLoRA: ``rank``, that device's LoRA rank)
    in place of the config's value for that client. A node config is the node's, for every app it runs: keys the
    method does not take are left to other apps; a bad value is a ConfigError naming the node config."""
    allowed, lists = FEDERATED[spec.method].node_settings, {}
    for i, cid in enumerate(clients):
        for key, value in declared.get(cid, {}).items():
            if key in allowed:
                values = lists.setdefault(allowed[key], list(getattr(spec.config, allowed[key])))
                if i >= len(values):
                    raise ConfigError(f"node config of client {i}: {key} = {short(value)}, but the config's "
                                      f"{allowed[key]} has {len(values)} entries")
                values[i] = value
    if not lists:
        return spec
    config = validate(type(spec.config), spec.config.model_dump() | lists, "node config")
    return JobSpec(spec.method, config, spec.data)


def check_node_settings(spec: JobSpec, declared: dict[int, dict[str, Any]]) -> None:
    """A ConfigError unless every setting nodes are to declare (node index -> key -> value) is one the method takes
    (`registry.Method.node_settings`) with a value its config accepts: checked before any model loads or process
    starts."""
    allowed = FEDERATED[spec.method].node_settings
    for node, settings in declared.items():
        for key in settings:
            if key not in allowed:
                raise ConfigError(f"--node-config {node}:{short(key)}: {spec.method} nodes declare "
                                  f"{', '.join(allowed) or 'no settings'}")
    nodes = max(declared, default=-1) + 1
    with_node_settings(spec, [str(i) for i in range(nodes)], {str(i): s for i, s in declared.items()})


def build(spec: JobSpec) -> FederatedJob:
    """The spec's federated job (loads the model and the data)."""
    entry = FEDERATED[spec.method]
    return getattr(importlib.import_module(entry.module), entry.job)(spec.config, spec.data)


def example_file(name: str) -> Path:
    """The shipped example file `name` (examples.py), written once into the cache folder, keyed by the source that
    writes it (same bytes every time)."""
    from collabalign import examples
    from collabalign.data.formats import file_hash
    from collabalign.models.backbones import cache_dir, write_once

    folder = write_once(cache_dir() / f"examples-{file_hash(examples.__file__)[:12]}", examples.write_examples)
    return next(folder.glob(f"{name}.*"))
