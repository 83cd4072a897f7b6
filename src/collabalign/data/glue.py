"""GLUE tasks from their original tsv files, validated row by row, and the tasks' metrics in plain numpy."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collabalign.data.errors import DataError, unreadable


@dataclass
class TextDataset:
    """Single sentences or sentence pairs with labels (int64 classes, or float32 scores when num_labels == 1)."""

    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray
    num_labels: int
    task: str
    metric: str

    def __len__(self) -> int:
        return len(self.text_a)


@dataclass(frozen=True)
class GlueLayout:
    """Which columns one task's tsv has and how its label column is read (by header name where it has a header)."""

    columns: tuple[str, ...]  # all of them in order (no header), else those the header must name (it may add more)
    header: bool
    text_a: str
    text_b: str | None
    label: str
    parse: Callable[[str], float | int]
    num_labels: int
    metric: str
    dev: str = "dev"  # the dev split's file stem


def _binary(value: str) -> int:
    """A 0/1 class label."""
    if value not in ("0", "1"):
        raise ValueError
    return int(value)


def _entailment(value: str) -> int:
    """RTE's and QNLI's label names as the hub's class ids (entailment = 0)."""
    return {"entailment": 0, "not_entailment": 1}[value]  # KeyError (a LookupError) for anything else


def _nli(value: str) -> int:
    """MNLI's gold label names as the hub's class ids."""
    return {"entailment": 0, "neutral": 1, "contradiction": 2}[value]


def _similarity(value: str) -> float:
    """An STS-B similarity score, which must lie in [0, 5]."""
    score = float(value)
    if not 0.0 <= score <= 5.0:  # also rejects nan
        raise ValueError
    return score


_STSB_COLUMNS = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
_MNLI_COLUMNS = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
                 "sentence1_parse", "sentence2_parse")
LAYOUTS: dict[str, GlueLayout] = {
    "CoLA": GlueLayout(
        columns=("source", "label", "mark", "sentence"),
        header=False,
        text_a="sentence",
        text_b=None,
        label="label",
        parse=_binary,
        num_labels=2,
        metric="matthews",
    ),
    "SST-2": GlueLayout(
        columns=("sentence", "label"),
        header=True,
        text_a="sentence",
        text_b=None,
        label="label",
        parse=_binary,
        num_labels=2,
        metric="accuracy",
    ),
    "MRPC": GlueLayout(
        columns=("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
        header=True,
        text_a="#1 String",
        text_b="#2 String",
        label="Quality",
        parse=_binary,
        num_labels=2,
        metric="accuracy",
    ),
    "RTE": GlueLayout(
        columns=("index", "sentence1", "sentence2", "label"),
        header=True,
        text_a="sentence1",
        text_b="sentence2",
        label="label",
        parse=_entailment,
        num_labels=2,
        metric="accuracy",
    ),
    "STS-B": GlueLayout(
        columns=(*_STSB_COLUMNS, "score"),
        header=True,
        text_a="sentence1",
        text_b="sentence2",
        label="score",
        parse=_similarity,
        num_labels=1,
        metric="pearson",
    ),
    "QNLI": GlueLayout(
        columns=("index", "question", "sentence", "label"),
        header=True,
        text_a="question",
        text_b="sentence",
        label="label",
        parse=_entailment,
        num_labels=2,
        metric="accuracy",
    ),
    "QQP": GlueLayout(
        columns=("id", "qid1", "qid2", "question1", "question2", "is_duplicate"),
        header=True,
        text_a="question1",
        text_b="question2",
        label="is_duplicate",
        parse=_binary,
        num_labels=2,
        metric="accuracy",
    ),
    "MNLI": GlueLayout(  # dev_matched.tsv adds label2..label5 before gold_label
        columns=(*_MNLI_COLUMNS, "sentence1", "sentence2", "label1", "gold_label"),
        header=True,
        text_a="sentence1",
        text_b="sentence2",
        label="gold_label",
        parse=_nli,
        num_labels=3,
        metric="accuracy",
        dev="dev_matched",  # the paper's validation_matched
    ),
}
GLUE_TASKS = tuple(LAYOUTS)


def glue_layout(task: str) -> GlueLayout:
    """The layout of a GLUE task, or a ValueError listing the supported tasks."""
    if task not in LAYOUTS:
        raise ValueError(f"unknown GLUE task {task!r}; expected one of {', '.join(GLUE_TASKS)}")
    return LAYOUTS[task]


def _decoded_lines(path: Path) -> Iterator[str]:
    """Decode a file line by line so invalid UTF-8 is reported with its line (the MRPC files start with a BOM); a
    file that cannot be read is a DataError naming it."""
    try:
        f = open(path, "rb")
    except OSError as err:
        raise unreadable(path, err) from err
    with f:
        for lineno, raw in enumerate(f, start=1):
            try:
                yield raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(path, lineno, None, "not valid UTF-8") from err


def _tsv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of a tab-separated file without quoting; a line csv cannot split is a DataError naming it."""
    reader = csv.reader(_decoded_lines(path), delimiter="\t", quoting=csv.QUOTE_NONE)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:  # e.g. a field over csv's size limit
            raise DataError(path, reader.line_num, None, f"cannot split into columns ({err})") from err
        yield reader.line_num, row


def glue_path(task: str, split: str, root: str | Path) -> Path:
    """root/<task>/<file>.tsv of a split ("train" or "dev"; MNLI's dev is dev_matched.tsv)."""
    layout = glue_layout(task)
    if split not in ("train", "dev"):
        raise ValueError(f"unknown GLUE split {split!r}; expected 'train' or 'dev' (test files have no labels)")
    return Path(root) / task / f"{layout.dev if split == 'dev' else split}.tsv"


def load_glue(task: str, split: str, root: str | Path) -> TextDataset:
    """Load a split's tsv (see glue_path) in GLUE's original layout; bad rows raise DataError."""
    layout, path = glue_layout(task), glue_path(task, split, root)
    columns: tuple[str, ...] | None = None if layout.header else layout.columns  # else the header's
    text_a: list[str] = []
    text_b: list[str] = []
    labels: list[float | int] = []
    for line, row in _tsv_rows(path):
        if not row:
            continue  # a blank line is not a row
        if columns is None:
            missing = [name for name in layout.columns if name not in row]
            if missing:
                raise DataError(path, line, None, f"header {row} lacks column(s) {missing}")
            columns = tuple(row)
            continue
        if len(row) != len(columns):
            first_missing = columns[len(row)] if len(row) < len(columns) else None
            raise DataError(path, line, first_missing, f"expected {len(columns)} tab-separated columns, got {len(row)}")
        value = dict(zip(columns, row, strict=True))
        for name in (layout.text_a, layout.text_b):
            if name is not None and not value[name].strip():
                raise DataError(path, line, name, "empty text")
        try:
            labels.append(layout.parse(value[layout.label].strip()))
        except (ValueError, LookupError) as err:
            raise DataError(path, line, layout.label, f"bad label {value[layout.label]!r}") from err
        text_a.append(value[layout.text_a].strip())
        if layout.text_b is not None:
            text_b.append(value[layout.text_b].strip())
    if not labels:
        raise DataError(path, None, None, "no rows")
    dtype = np.float32 if layout.num_labels == 1 else np.int64
    return TextDataset(
        text_a, text_b if layout.text_b else None, np.asarray(labels, dtype), layout.num_labels, task, layout.metric
    )


def glue_metric(task: str, preds: np.ndarray, labels: np.ndarray) -> float:
    """The task's GLUE metric: accuracy, Matthews correlation (CoLA) or Pearson correlation (STS-B)."""
    preds, labels = np.asarray(preds), np.asarray(labels)
    if preds.shape != labels.shape or preds.size == 0:
        raise ValueError(f"preds {preds.shape} and labels {labels.shape} must be equal, non-empty 1-d shapes")
    metric = glue_layout(task).metric
    if metric == "accuracy":
        return float(np.mean(preds == labels))
    if metric == "matthews":
        return matthews_corr(preds, labels)
    return pearson_corr(preds, labels)


def matthews_corr(preds: np.ndarray, labels: np.ndarray) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K); 0.0 when undefined, as scikit-learn does."""
    classes, inv = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    k, n = len(classes), len(labels)
    confusion = np.zeros((k, k), np.float64)
    np.add.at(confusion, (inv[:n], inv[n:]), 1.0)
    t, p, c, s = confusion.sum(1), confusion.sum(0), np.trace(confusion), confusion.sum()
    denom = math.sqrt((s * s - p @ p) * (s * s - t @ t))
    return float((c * s - t @ p) / denom) if denom > 0 else 0.0


def pearson_corr(preds: np.ndarray, labels: np.ndarray) -> float:
    """Pearson correlation; 0.0 when either side is constant (the correlation is undefined there)."""
    x = preds.astype(np.float64) - preds.mean()
    y = labels.astype(np.float64) - labels.mean()
    denom = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y / denom) if denom > 0 else 0.0
