"""The documented JSONL formats a user brings, one validating loader each; every bad row is a DataError naming the
file, line and field.

- preference pairs: {"prompt": str, "chosen": str, "rejected": str, "user"?: str|int, "domain"?: str|int}
- prompts:          {"prompt": str}
- labelled text:    {"text": str, "text_pair"?: str, "label": int class (0..K-1) or float score}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from collabalign.data.errors import DataError
from collabalign.data.glue import TextDataset
from collabalign.data.jsonl import open_maybe_gzip, read_jsonl
from collabalign.data.preferences import PreferencePair, PreferenceSet, collect_pairs, require_text

EXAMPLES = {
    "pairs": '{"prompt": "Summarise: the cat sat.", "chosen": "A cat sat.", "rejected": "Dogs.", "user": "ana"}',
    "prompts": '{"prompt": "How do I keep basil fresh?"}',
    "labelled": '{"text": "a gripping, funny film", "label": 1}',
}


def file_hash(path: str | Path) -> str:
    """sha256 of a data file's bytes (the manifest's data hash); an unreadable file is a DataError."""
    digest = hashlib.sha256()
    with open_maybe_gzip(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def json_hash(value: Any) -> str:
    """sha256 of a value's JSON: the manifest's data hash of data passed already loaded."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def _key(obj: dict[str, Any], name: str, path: str | Path, line: int) -> str | None:
    """An optional grouping field (user, domain) as text: absent is None; a string or integer, else a DataError."""
    if name not in obj or obj[name] is None:
        return None
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(path, line, name, "must be a string or an integer")
    if isinstance(value, str) and not value.strip():
        raise DataError(path, line, name, "empty text")
    return str(value)


def load_pairs(path: str | Path, require: tuple[str, ...] = ()) -> PreferenceSet:
    """Preference pairs: `user` becomes the pair's party, `domain` its attribute; `require` names the optional fields
    every row must carry (e.g. ("user",) for personal reward models)."""

    def make(line: int, obj: dict[str, Any]) -> list[PreferencePair]:
        prompt, chosen, rejected = (require_text(obj, f, path, line) for f in ("prompt", "chosen", "rejected"))
        if chosen.strip() == rejected.strip():
            raise DataError(path, line, "rejected", "identical to chosen")
        user, domain = _key(obj, "user", path, line), _key(obj, "domain", path, line)
        for name, value in (("user", user), ("domain", domain)):
            if name in require and value is None:
                raise DataError(path, line, name, "missing field")
        return [PreferencePair(prompt, chosen, rejected, user, {} if domain is None else {"domain": domain})]

    return collect_pairs(path, read_jsonl(path), make, drop_invalid=False)


def load_prompts(path: str | Path) -> list[str]:
    """The `prompt` of every row, in file order."""
    prompts = []
    for line, obj in read_jsonl(path):
        if isinstance(obj, DataError):
            raise obj
        prompts.append(require_text(obj, "prompt", path, line))
    if not prompts:
        raise DataError(path, None, None, "no rows")
    return prompts


def _label(obj: dict[str, Any], path: str | Path, line: int) -> int | float:
    if "label" not in obj:
        raise DataError(path, line, "label", "missing field")
    value = obj["label"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise DataError(path, line, "label", "must be an integer class or a finite number")
    if isinstance(value, int) and value < 0:
        raise DataError(path, line, "label", "a class must be >= 0")
    return value


def load_labelled(path: str | Path) -> TextDataset:
    """Labelled text: integer labels make a classification task with classes 0..max (each class present at least
    once is not required), any float label a regression task (one output); `text_pair` in every row or in none."""
    texts, pairs, labels = [], [], []
    first_line = None
    for line, obj in read_jsonl(path):
        if isinstance(obj, DataError):
            raise obj
        texts.append(require_text(obj, "text", path, line))
        has_pair = "text_pair" in obj
        if first_line is None:
            first_line, paired = line, has_pair
        elif has_pair != paired:
            raise DataError(path, line, "text_pair", f"{'present' if has_pair else 'missing'} here but "
                            f"{'present' if paired else 'missing'} on line {first_line}: give it in every row or none")
        if has_pair:
            pairs.append(require_text(obj, "text_pair", path, line))
        labels.append(_label(obj, path, line))
    if not texts:
        raise DataError(path, None, None, "no rows")
    regression = any(isinstance(v, float) for v in labels)
    y = np.asarray(labels, dtype=np.float32 if regression else np.int64)
    return TextDataset(texts, pairs if paired else None, y, 1 if regression else int(y.max()) + 1, Path(path).stem,
                       "pearson" if regression else "accuracy")


def pairs_and_hash(data: str | Path | PreferenceSet, require: tuple[str, ...] = ()) -> tuple[PreferenceSet, str]:
    """An entry point's preference data: a JSONL path (loaded and checked) or pairs already loaded, and the sha256
    the manifest records (of the file, or of the pairs' JSON)."""
    if isinstance(data, str | Path):
        return load_pairs(data, require), file_hash(data)
    for name in require:
        missing = next((i for i, p in enumerate(data) if _field(p, name) is None), None)
        if missing is not None:
            raise DataError(getattr(data, "source", "pairs"), missing + 1, name, "missing field")
    rows = [[p.prompt, p.chosen, p.rejected, p.party, p.attributes.get("domain")] for p in data]
    return data, json_hash(rows)


def _field(pair: PreferencePair, name: str) -> str | None:
    return pair.party if name == "user" else pair.attributes.get(name)


def load_texts(path: str | Path) -> tuple[list[str], list[str] | None]:
    """Texts to score: rows {"text", "text_pair"?} (a classifier's input) or {"prompt", "response"} (scored as
    prompt + response, as reward models are trained); one form in every row."""
    texts, pairs = [], []
    for line, obj in read_jsonl(path):
        if isinstance(obj, DataError):
            raise obj
        if "text" in obj:
            texts.append(require_text(obj, "text", path, line))
            if "text_pair" in obj:
                pairs.append(require_text(obj, "text_pair", path, line))
        elif "prompt" in obj:
            texts.append(require_text(obj, "prompt", path, line) + require_text(obj, "response", path, line))
        else:
            raise DataError(path, line, "text", "missing field (give text, or prompt and response)")
        if pairs and len(pairs) != len(texts):
            raise DataError(path, line, "text_pair", "missing here but given on an earlier line")
    if not texts:
        raise DataError(path, None, None, "no rows")
    return texts, pairs or None
