"""Pydantic configs from YAML with dotted overrides (``a.b=3``); errors name the bad key and value."""

from __future__ import annotations

import copy
import reprlib
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

MAX_CONFIG_BYTES = 1_000_000  # a config file larger than this is refused before it is parsed
MAX_OVERRIDE_CHARS = 10_000  # likewise one `a.b=value` override
MAX_VALUE_CHARS = 80  # a value shown in an error line is cut to this length
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, MAX_VALUE_CHARS, MAX_VALUE_CHARS
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 8


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message names the key and value."""


class Strict(BaseModel):
    """Base for all configs: unknown keys are errors, not silently ignored; no float may be nan or infinite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def cut(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """`text`, or its first `limit` - 3 characters and '...'."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any) -> str:
    """`repr(value)` cut to a readable length, without building the whole repr of a huge value."""
    return cut(_SHORT.repr(value))


def _distinct(items: list[T]) -> list[T]:
    """`items` unchanged, or a ValueError naming the repeated values (a repeat would be counted twice)."""
    seen: set[T] = set()
    repeated = []
    for x in items:
        if x in seen:
            repeated.append(x)
        seen.add(x)
    if repeated:
        raise ValueError(f"repeated value(s) {short(repeated)}: each may appear once")
    return items


class _NoAliases(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (`*name`): a few bytes of nested aliases expand to billions of values."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in configs",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def _parse_yaml(text: str) -> Any:
    """YAML text to Python values, refusing aliases."""
    return yaml.load(text, Loader=_NoAliases)  # a SafeLoader: plain data only


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
    if len(text) > MAX_OVERRIDE_CHARS:
        raise ConfigError(f"override {short(text)}: {len(text):,} characters; an override may have at most "
                          f"{MAX_OVERRIDE_CHARS:,} (put large values in a config file)")
    if "=" not in text:
        raise ConfigError(f"override {short(text)} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {short(text)} has an empty key part")
    try:
        value = _parse_yaml(raw) if raw != "" else ""
    except (yaml.YAMLError, RecursionError) as err:
        raise ConfigError(f"override {cut(key)}: cannot parse value {short(raw)}: {_yaml_problem(err)}") from None
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
                raise ConfigError(f"override {short(text)}: {short(part)} is a value ({short(child)}), "
                                  "not a section")
            node = child
        node[path[-1]] = value
    return out


def field_problems(err: ValidationError) -> list[str]:
    """One 'key = value: problem' line per failed field of a pydantic error; a check across fields (on the whole
    config) is its message alone, which names the fields."""
    return [e["msg"] if not e["loc"] and isinstance(e.get("input"), dict | list)
            else f"{cut('.'.join(str(p) for p in e['loc'])) or '<root>'} = {short(e.get('input'))}: {e['msg']}"
            for e in err.errors()]


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
    """A config file's top-level mapping; a missing, unreadable, too large, non-UTF-8 or malformed file, or one with
    YAML aliases, is a ConfigError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:  # read no more than a config may hold (/dev/zero is no config)
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: more than {MAX_CONFIG_BYTES:,} bytes; a config file may have at most "
                              f"{MAX_CONFIG_BYTES:,}")
        data = _parse_yaml(raw.decode("utf-8"))
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
