"""The LLM-Adapters commonsense reasoning data (Hu et al. 2023) that FSLoRA fine-tunes LLaMA on: Commonsense170K
(`commonsense_170k.json`, the 8 tasks mixed) and each task's `<task>/test.json`, both a JSON list of
{instruction, input, output, answer}, validated record by record; the prompt template and answer extraction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collabalign.data.errors import DataError
from collabalign.data.jsonl import read_json

# task (LLM-Adapters' folder name) -> the answers its prompt asks for, as the regex its evaluation code extracts
ANSWER_PATTERNS: dict[str, str] = {
    "boolq": r"true|false",
    "piqa": r"solution1|solution2",
    "social_i_qa": r"answer1|answer2|answer3|answer4|answer5",
    "hellaswag": r"ending1|ending2|ending3|ending4",
    "winogrande": r"option1|option2",
    "ARC-Challenge": r"answer1|answer2|answer3|answer4|answer5",
    "ARC-Easy": r"answer1|answer2|answer3|answer4|answer5",
    "openbookqa": r"answer1|answer2|answer3|answer4|answer5",
}
COMMONSENSE_TASKS = tuple(ANSWER_PATTERNS)
_TEXT_FIELDS = (("instruction", False), ("input", True), ("output", False), ("answer", False))  # (name, may be empty)


@dataclass(frozen=True)
class CommonsenseExample:
    """One instruction-following example; `answer` is the label the output states (e.g. 'true', 'option2')."""

    instruction: str
    input: str
    output: str
    answer: str


def _pattern(task: str) -> str:
    if task not in ANSWER_PATTERNS:
        raise ValueError(f"unknown commonsense task {task!r}; expected one of {', '.join(COMMONSENSE_TASKS)}")
    return ANSWER_PATTERNS[task]


def load_commonsense(path: str | Path, task: str | None = None) -> list[CommonsenseExample]:
    """Read one LLM-Adapters JSON file; with `task`, every answer must be one of that task's labels. A bad record
    raises DataError naming the file, the 1-based record number and the field."""
    pattern = None if task is None else _pattern(task)
    path = Path(path)
    records = read_json(path)
    if not isinstance(records, list) or not records:
        raise DataError(path, None, None, "expected a non-empty JSON list of records")
    out = []
    for number, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            raise DataError(path, number, None, "record is not a JSON object")
        for name, may_be_empty in _TEXT_FIELDS:
            value = record.get(name)
            if not isinstance(value, str):
                raise DataError(path, number, name, "missing" if value is None else f"not a string: {value!r}")
            if not may_be_empty and not value.strip():
                raise DataError(path, number, name, "empty text")
        if pattern is not None and not re.fullmatch(pattern, record["answer"]):
            raise DataError(path, number, "answer", f"{record['answer']!r} is not a {task} answer ({pattern})")
        out.append(CommonsenseExample(*(record[name] for name, _ in _TEXT_FIELDS)))
    return out


def load_commonsense_test(root: str | Path, task: str) -> list[CommonsenseExample]:
    """A task's test set, `root/<task>/test.json` (LLM-Adapters' `dataset/` folder layout)."""
    _pattern(task)  # an unknown task fails before any path is built from it
    return load_commonsense(Path(root) / task / "test.json", task)


def commonsense_prompt(example: CommonsenseExample) -> str:
    """LLM-Adapters' Alpaca-style prompt, up to and including '### Response:\\n'; the output follows it."""
    if example.input:
        return ("Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                f"### Instruction:\n{example.instruction}\n\n### Input:\n{example.input}\n\n### Response:\n")
    return ("Below is an instruction that describes a task. Write a response that appropriately completes the "
            f"request.\n\n### Instruction:\n{example.instruction}\n\n### Response:\n")


def extract_answer(task: str, text: str) -> str:
    """The first answer label of `task` in generated `text` ('' if none), as LLM-Adapters' evaluation scores it."""
    found = re.search(_pattern(task), text)
    return found.group(0) if found else ""
