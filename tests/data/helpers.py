"""Shared helpers for the data tests: writing small fixture files (MNLI rows, a small HH-RLHF file) and the skip
marker for real data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from collabalign.data import shared_data_dir
from collabalign.data.hh_rlhf import HH_FILE

SHARED = shared_data_dir()
needs_shared_data = [
    pytest.mark.real,
    pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)"),
]


def write(path: Path, content: str | bytes, gz: bool = False) -> Path:
    """Write text or bytes to path, gzip-compressed when gz, and return the path."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def jsonl(*rows: object) -> str:
    """JSON lines for the given rows."""
    return "".join(json.dumps(r) + "\n" for r in rows)


# MNLI's columns before its labels (train: label1, gold_label; dev_matched: label1..label5, gold_label)
MNLI_HEAD = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
             "sentence2_parse\tsentence1\tsentence2\t")


def mnli_row(i: int, premise: str, hypothesis: str, *labels: str) -> str:
    """One MNLI row: ids, genre, (stand-in) parses, the pair, then the annotators' labels and the gold label."""
    parses = [f"( {premise} )", f"( {hypothesis} )", "(ROOT)", "(ROOT)"]
    return "\t".join([str(i), f"{i}1", f"{i}1e", "fiction", *parses, premise, hypothesis, *labels]) + "\n"


HH_ROWS = [{"chosen": f"\n\nHuman: Question {i}?\n\nAssistant: Sorry, I can't help you with {i}.",
            "rejected": f"\n\nHuman: Question {i}?\n\nAssistant: Sure! Do you want more? " + "word " * (i % 5)}
           for i in range(24)]


def write_hh(root: Path) -> Path:
    """The 24 `HH_ROWS` as `root / HH_FILE` (the shared data folder's layout); returns that file."""
    (root / "hh-rlhf").mkdir(parents=True, exist_ok=True)
    return write(root / HH_FILE, jsonl(*HH_ROWS), gz=True)
