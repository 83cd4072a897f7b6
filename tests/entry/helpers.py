"""Shared pieces of the entry-point tests: a user's own JSONL written in a temporary folder (field values the project
never uses), in-process scores of a trained pooled model, and the malformed-line check."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from collabalign.data.errors import DataError
from collabalign.models.pooled import tokenize

FRUIT = ["quince", "medlar", "loquat", "sapote", "jabuticaba", "salak"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def user_pairs(n: int = 48, users: int = 3, domains: int = 0) -> list[dict]:
    """Pairs whose chosen reply praises the fruit and whose rejected one does not; users (and domains) round-robin."""
    rows = []
    for i in range(n):
        fruit = FRUIT[i % len(FRUIT)]
        row = {"prompt": f"Tell me about the {fruit} ({i}).", "chosen": f"The {fruit} is sweet and lovely.",
               "rejected": f"{fruit}? No idea, go away."}
        row["user"] = f"grower-{i % users}"
        if domains:
            row["domain"] = f"orchard-{i % domains}"
        rows.append(row)
    return rows


@torch.no_grad()
def pooled_scores(pooled, tokenizer, texts: list[str], max_length: int, second=None) -> np.ndarray:
    """In-process scores (n, outputs) of a trained `PooledModel`."""
    return pooled(tokenize(tokenizer, texts, max_length, second)).reshape(len(texts), -1).float().numpy()


def assert_bad_line_named(train, tmp_path: Path, good_rows: list[dict], field: str, bad_value) -> None:
    """`train(path)` on a file whose third row has `field` = `bad_value` raises a DataError naming file:3 and field."""
    rows = [dict(r) for r in good_rows]
    rows[2][field] = bad_value
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as err:
        train(path)
    assert (err.value.path, err.value.line, err.value.field) == (str(path), 3, field)
