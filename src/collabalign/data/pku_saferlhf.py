"""PKU-SafeRLHF rows (one prompt, two replies, a helpfulness and a harmlessness preference, per-reply safety labels)
and the prompt lists FIRM's policy is trained on (PKU prompts, HH-RLHF harmless prompts)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabalign.data.annotator_pools import last_human_turn
from collabalign.data.errors import DataError
from collabalign.data.hh_rlhf import load_hh_rlhf
from collabalign.data.jsonl import read_jsonl
from collabalign.data.preferences import require_text

PKU_FILE = "pku-saferlhf/alpaca7b-test-head.jsonl.gz"  # where the shared data folder keeps the PKU rows


@dataclass(frozen=True)
class PkuRow:
    """One PKU-SafeRLHF comparison: `better_response_id` is the more helpful reply, `safer_response_id` the more
    harmless one, `safe` the per-reply safety labels (is_response_0_safe, is_response_1_safe)."""

    prompt: str
    response_0: str
    response_1: str
    better_response_id: int
    safer_response_id: int
    is_response_0_safe: bool
    is_response_1_safe: bool

    @property
    def responses(self) -> tuple[str, str]:
        return self.response_0, self.response_1

    @property
    def safe(self) -> tuple[bool, bool]:
        return self.is_response_0_safe, self.is_response_1_safe


def _choice(obj: dict[str, Any], name: str, path: str | Path, line: int) -> int:
    if name not in obj:
        raise DataError(path, line, name, "missing field")
    value = obj[name]
    if isinstance(value, bool) or value not in (0, 1):
        raise DataError(path, line, name, f"must be 0 or 1, got {value!r}")
    return int(value)


def _flag(obj: dict[str, Any], name: str, path: str | Path, line: int) -> bool:
    if name not in obj:
        raise DataError(path, line, name, "missing field")
    if not isinstance(obj[name], bool):
        raise DataError(path, line, name, f"must be true or false, got {obj[name]!r}")
    return obj[name]


def pku_row(obj: dict[str, Any], path: str | Path, line: int) -> PkuRow:
    """One validated row; a missing, mistyped or out-of-range field raises a DataError naming it."""
    texts = [require_text(obj, name, path, line) for name in ("prompt", "response_0", "response_1")]
    return PkuRow(*texts, _choice(obj, "better_response_id", path, line), _choice(obj, "safer_response_id", path, line),
                  _flag(obj, "is_response_0_safe", path, line), _flag(obj, "is_response_1_safe", path, line))


def load_pku_saferlhf(path: str | Path) -> list[PkuRow]:
    """All rows of a PKU-SafeRLHF .jsonl(.gz) file; the first bad row raises a DataError (file, line, field)."""
    rows = []
    for line, obj in read_jsonl(path):
        if isinstance(obj, DataError):
            raise obj
        rows.append(pku_row(obj, path, line))
    if not rows:
        raise DataError(path, None, None, "no rows")
    return rows


def _unique(texts: list[str]) -> list[str]:
    return list(dict.fromkeys(texts))


def pku_prompts(rows: list[PkuRow]) -> list[str]:
    """The distinct prompts of the rows, in file order."""
    return _unique([r.prompt for r in rows])


def hh_prompts(path: str | Path, last_turn: bool = True) -> list[str]:
    """Distinct prompts of an HH-RLHF file, in file order: the last Human turn (`last_turn`, what a single-turn chat
    policy is asked), else the whole dialogue before the final "Assistant:" turn. Rows the loader drops are
    skipped (load_hh_rlhf counts them)."""
    prompts = [p.prompt for p in load_hh_rlhf(path, drop_invalid=True)]
    return _unique([last_human_turn(p) for p in prompts] if last_turn else prompts)
