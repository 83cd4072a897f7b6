"""Preference pairs, their validated construction, and a generic JSONL loader with explicit drop accounting."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collabalign.data.errors import DataError


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: for `prompt`, `chosen` was preferred over `rejected` (by `party`, when known)."""

    prompt: str
    chosen: str
    rejected: str
    party: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass
class PreferenceSet:
    """Loaded pairs plus how many rows were dropped for which reason, so nothing disappears unnoticed."""

    pairs: list[PreferencePair]
    dropped: dict[str, int]
    source: str

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> PreferencePair:
        return self.pairs[i]

    def __iter__(self) -> Iterator[PreferencePair]:
        return iter(self.pairs)


def attribute_labels(data: PreferenceSet, name: str) -> list[str]:
    """Each pair's attribute `name` as text (the keys of a split by attribute); an attribute some pair lacks is a
    DataError naming it and the attributes every pair has, never a silent group of None labels."""
    lacking = next((i for i, p in enumerate(data) if name not in p.attributes), None)
    if lacking is not None:
        known = sorted(set.intersection(*(set(p.attributes) for p in data)))
        raise DataError(data.source, None, name, f"unknown split attribute (pair {lacking + 1} lacks it); "
                                                 f"known: {known}")
    return [str(p.attributes[name]) for p in data]


def require_text(obj: dict[str, Any], name: str, path: str | Path, line: int | None) -> str:
    """Return obj[name] if it is a non-blank string, else raise a DataError naming the field."""
    if name not in obj:
        raise DataError(path, line, name, "missing field")
    value = obj[name]
    if not isinstance(value, str):
        raise DataError(path, line, name, "not a string")
    if not value.strip():
        raise DataError(path, line, name, "empty text")
    return value


def same_reply(a: str, b: str) -> bool:
    """Whether two replies are the same text once every run of whitespace is one space and the ends are stripped: a
    pair that differs only in whitespace carries no preference."""
    return " ".join(a.split()) == " ".join(b.split())


def checked_pair(
    path: str | Path,
    line: int | None,
    prompt: str,
    chosen: str,
    rejected: str,
    party: str | None = None,
    attributes: dict[str, Any] | None = None,
) -> PreferencePair:
    """Build a PreferencePair after checking its texts are non-blank and distinct beyond whitespace (`same_reply`: a
    tie carries no preference)."""
    for name, text in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected)):
        if not text.strip():
            raise DataError(path, line, name, "empty text")
    if same_reply(chosen, rejected):
        raise DataError(path, line, "rejected", "identical to chosen")
    return PreferencePair(prompt, chosen, rejected, party, dict(attributes or {}))


def collect_pairs(
    source: str | Path,
    records: Iterable[tuple[int, Any]],
    make: Callable[[int, Any], list[PreferencePair] | str],
    drop_invalid: bool,
) -> PreferenceSet:
    """Turn (line, record) items into a PreferenceSet, raising the first DataError or counting them by reason.

    A record may itself be a DataError (from the reader); `make` may return a reason instead of pairs for a valid
    row that carries no preference (always counted in `dropped`). An empty result is always an error.
    """
    pairs: list[PreferencePair] = []
    dropped: Counter[str] = Counter()
    for line, record in records:
        try:
            if isinstance(record, DataError):
                raise record
            made = make(line, record)
        except DataError as err:
            if not drop_invalid:
                raise
            dropped[err.message if err.field is None else f"{err.field}: {err.message}"] += 1
            continue
        if isinstance(made, str):
            dropped[made] += 1
        else:
            pairs.extend(made)
    if not pairs:
        detail = f"no valid rows (dropped: {dict(dropped)})" if dropped else "no rows"
        raise DataError(source, None, None, detail)
    return PreferenceSet(pairs, dict(dropped), str(source))

