"""Pydantic configs from YAML with dotted overrides (``a.b=3``); errors name the bad key and value."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and value."""


class Strict(BaseModel):
    """Base for all configs: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=3' -> (['a', 'b'], 3); the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {err}") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Returns a copy of `data` with each dotted override set (nested dicts created as needed)."""
    import copy

    out = copy.deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value ({child!r}), not a section")
            node = child
        node[path[-1]] = value
    return out


def validate(model: type[T], data: dict[str, Any], source: str = "config") -> T:
    """Builds `model` from `data`; a failure names every bad key with the value given."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            key = ".".join(str(p) for p in e["loc"]) or "<root>"
            lines.append(f"  {key} = {e.get('input')!r}: {e['msg']}")
        raise ConfigError(f"{source}: invalid config\n" + "\n".join(lines)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load(model: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None) -> T:
    """YAML file (or `base` dict) + dotted overrides -> validated `model`."""
    data = read_yaml(path) if path is not None else dict(base or {})
    return validate(model, apply_overrides(data, overrides or []), str(path or "config"))
