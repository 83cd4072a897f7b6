"""The documented JSONL formats a user brings, one validating loader each; every bad row is a DataError naming the
file, line and field.

- preference pairs: {"prompt": str, "chosen": str, "rejected": str, "user"?: str|int, "domain"?: str|int}
- prompts:          {"prompt": str}
- labelled text:    {"text": str, "text_pair"?: str, "label": int class (0..K-1) or float score}

Users and domains are names (`data.names`: a documented character set, case-sensitive, type-exact); every file is
read within `data.limits`.
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
from collabalign.data.limits import read_limits
from collabalign.data.names import NameBook
from collabalign.data.preferences import PreferencePair, PreferenceSet, collect_pairs, require_text, same_reply

MAX_CLASSES = 1000  # integer labels are classes 0..K-1 with K at most this
EXAMPLES = {
    "pairs": '{"prompt": "Summarise: the cat sat.", "chosen": "A cat sat.", "rejected": "Dogs.", "user": "ana"}',
    "prompts": '{"prompt": "How do I keep basil fresh?"}',
    "labelled": '{"text": "a gripping, funny film", "label": 1}',
}


def file_hash(path: str | Path) -> str:
    """sha256 of a data file's bytes (the manifest's data hash); an unreadable file, or one bigger than the data
    limit (`data.limits`), is a DataError."""
    digest, total, limit = hashlib.sha256(), 0, read_limits().data_bytes
    with open_maybe_gzip(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            if (total := total + len(block)) > limit:
                raise DataError(path, None, None, f"more than {limit:,} bytes of data, decompressed "
                                "(COLLABALIGN_MAX_DATA_BYTES)")
    return digest.hexdigest()


def json_hash(value: Any) -> str:
    """sha256 of a value's JSON: the manifest's data hash of data passed already loaded."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def load_pairs(path: str | Path, require: tuple[str, ...] = ()) -> PreferenceSet:
    """Preference pairs: `user` becomes the pair's party, `domain` its attribute (both names, `data.names`);
    `require` names the optional fields every row must carry (e.g. ("user",) for personal reward models)."""
    books = {name: NameBook(path, name) for name in ("user", "domain")}

    def make(line: int, obj: dict[str, Any]) -> list[PreferencePair]:
        prompt, chosen, rejected = (require_text(obj, f, path, line) for f in ("prompt", "chosen", "rejected"))
        if same_reply(chosen, rejected):
            raise DataError(path, line, "rejected", "identical to chosen")
        user, domain = (None if obj.get(f) is None else books[f].add(obj[f], line) for f in ("user", "domain"))
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
    if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value < MAX_CLASSES:
        raise DataError(path, line, "label", f"a class must be in 0..{MAX_CLASSES - 1}")
    if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
        raise DataError(path, line, "label", "must be an integer class or a finite number")
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
    if len(set(labels)) < 2:
        raise DataError(path, None, "label", f"every row has the label {labels[0]!r}: nothing to learn (a classifier "
                        "needs two classes or more, a regression two values or more)")
    regression = any(isinstance(v, float) for v in labels)
    y = np.asarray(labels, dtype=np.float32 if regression else np.int64)
    return TextDataset(texts, pairs if paired else None, y, 1 if regression else int(y.max()) + 1, Path(path).stem,
                       "pearson" if regression else "accuracy")


def pairs_and_hash(data: str | Path | PreferenceSet, require: tuple[str, ...] = ()) -> tuple[PreferenceSet, str]:
    """An entry point's preference data: a JSONL path (loaded and checked) or pairs already loaded, and the sha256
    the manifest records (of the file, or of the pairs' JSON)."""
    if isinstance(data, str | Path):
        return load_pairs(data, require), file_hash(data)
    source = getattr(data, "source", "pairs")
    for name in ("user", "domain"):
        book = NameBook(source, name)
        for i, pair in enumerate(data):
            if (value := _field(pair, name)) is not None:
                book.add(value, i + 1)
            elif name in require:
                raise DataError(source, i + 1, name, "missing field")
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
