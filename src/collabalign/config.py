"""Pydantic configs from YAML with dotted overrides (``a.b=3``); errors name the bad key and value."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and value."""


class Strict(BaseModel):
    """Base for all configs: unknown keys are errors, not silently ignored; no float may be nan or infinite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _distinct(items: list[T]) -> list[T]:
    """`items` unchanged, or a ValueError naming the repeated values (a repeat would be counted twice)."""
    repeated = [x for i, x in enumerate(items) if x in items[:i]]
    if repeated:
        raise ValueError(f"repeated value(s) {repeated}: each may appear once")
    return items


Distinct = Annotated[list[T], AfterValidator(_distinct)]  # a list of distinct values, possibly empty
Grid = Annotated[list[T], Field(min_length=1), AfterValidator(_distinct)]  # seeds, methods, a sweep's values
Fraction = Annotated[float, Field(gt=0, le=1)]  # a share that must keep something: (0, 1]
Probability = Annotated[float, Field(ge=0, le=1)]  # [0, 1]: a probability, or a share that may be 0


class LoRASection(Strict):
    """The `lora:` section of every entry point: rank, alpha (scale alpha / rank unless the method defines its own,
    as FSLoRA's alpha / sqrt(rank)), the linear layers it adapts (None: the architecture's defaults,
    `lora.targets.DEFAULT_TARGETS`) and how many top blocks get it (None: all)."""

    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    targets: Distinct[str] | None = None
    blocks: PositiveInt | None = None
    dropout: float = Field(0.0, ge=0, lt=1)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=3' -> (['a', 'b'], 3); the value is parsed as YAML (numbers, bools, lists)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"override {key}: cannot parse value {raw!r}: {_yaml_problem(err)}") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Returns a copy of `data` with each dotted override set (nested dicts created as needed)."""
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


def field_problems(err: ValidationError) -> list[str]:
    """One 'key = value: problem' line per failed field of a pydantic error."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '<root>'} = {e.get('input')!r}: {e['msg']}" for e in err.errors()]


def validate(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Builds `model` from `data`; a failure names every bad key with the value given."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        lines = "\n".join(f"  {line}" for line in field_problems(err))
        raise ConfigError(f"{source}: invalid config\n{lines}") from None


def _yaml_problem(err: Exception) -> str:
    """A YAML parse error in one line, with its 1-based line where PyYAML knows it."""
    if isinstance(err, RecursionError):
        return "nested too deeply"
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A config file's top-level mapping; a missing, unreadable, non-UTF-8 or malformed file is a ConfigError."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a directory, not a config file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {err.start})") from None
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load(model: type[M], path: str | Path | None = None, overrides: list[str] | None = None,
         base: dict[str, Any] | None = None) -> M:
    """YAML file (or `base` dict) + dotted overrides -> validated `model`."""
    data = read_yaml(path) if path is not None else dict(base or {})
    return validate(model, apply_overrides(data, overrides or []), str(path or "config"))
