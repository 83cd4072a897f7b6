"""BIG-bench hhh_alignment: each example's better reply against each worse one, one subset per party."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collabalign.data.errors import DataError
from collabalign.data.jsonl import read_json
from collabalign.data.preferences import PreferencePair, PreferenceSet, checked_pair, collect_pairs, require_text

HHH_SUBSETS = ("helpful", "harmless", "honest", "other")


def load_hhh(path: str | Path, party: str | None = None, drop_invalid: bool = False) -> PreferenceSet:
    """Load one hhh_alignment task.json as pairs; party defaults to the folder name (helpful, harmless, ...).

    The reply scored 1 is chosen and each reply scored 0 is rejected (one pair per rejected reply). In errors,
    `line` is the 1-based example number (the file's line for JSON syntax errors). Evaluation only, as the
    benchmark's canary asks.
    """
    path = Path(path)
    party = party or path.parent.name
    task = read_json(path)
    if not isinstance(task, dict):
        raise DataError(path, None, None, "not a JSON object")
    examples = task.get("examples")
    if not isinstance(examples, list):
        raise DataError(path, None, "examples", "missing or not a list")

    def make(index: int, example: Any) -> list[PreferencePair]:
        if not isinstance(example, dict):
            raise DataError(path, index, None, "example is not a JSON object")
        prompt = require_text(example, "input", path, index)
        scores = example.get("target_scores")
        if not isinstance(scores, dict) or not scores:
            raise DataError(path, index, "target_scores", "missing, empty or not an object")
        if any(not isinstance(s, int) or isinstance(s, bool) or s not in (0, 1) for s in scores.values()):
            raise DataError(path, index, "target_scores", "scores must be 0 or 1")
        best = [reply for reply, s in scores.items() if s == 1]
        worse = [reply for reply, s in scores.items() if s == 0]
        if len(best) != 1 or not worse:
            raise DataError(path, index, "target_scores", "needs exactly one reply scored 1 and at least one scored 0")
        return [checked_pair(path, index, prompt, best[0], reply, party) for reply in worse]

    return collect_pairs(path, enumerate(examples, start=1), make, drop_invalid)
