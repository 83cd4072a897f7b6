"""Names in the data (users, domains, agents) and the adapter names made from them are data, never paths.

A name is 1 to 64 characters from ASCII letters, digits, `_`, `.` and `-`, starting with a letter, a digit or `_`
(so no separator, no `..`, no hidden or option-like name, nothing a file system treats specially). Names are
case-sensitive and type-exact: the user `1` (a number) and `"1"` (a string) are two spellings of one folder name and
are refused together, as are `Ana` and `ana` (one folder on case-insensitive file systems). Every folder made from
a name is also checked to lie inside its run folder before anything is written (`inside`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from collabalign.data.errors import DataError

MAX_NAME_CHARS = 64
MAX_FOLDER_CHARS = 128  # a folder made from a name (adapters/user-<name>): a prefix and the name
_FIRST, _REST = "A-Za-z0-9_", "A-Za-z0-9_.-"


def name_problem(name: str, max_chars: int = MAX_NAME_CHARS) -> str | None:
    """Why `name` is not a valid name (of at most `max_chars` characters), or None when it is."""
    if re.fullmatch(f"[{_FIRST}][{_REST}]{{0,{max_chars - 1}}}", name):
        return None
    shown = repr(name[:40] + ("..." if len(name) > 40 else ""))
    return f"{shown} is not a name (1 to {max_chars} of A-Z a-z 0-9 _ . -, starting with a letter, a digit or _)"


def check_name(value: Any, path: str | Path, line: int | None, field: str) -> str:
    """A name given as a string or an integer, as text; anything else, or text outside the rule, is a DataError
    naming the file, line and field."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(path, line, field, "must be a string or an integer")
    text = str(value)
    if (problem := name_problem(text)) is not None:
        raise DataError(path, line, field, problem)
    return text


class NameBook:
    """The names of one field seen so far in a file, refusing two spellings of one name (`1` and `"1"`, `Ana` and
    `ana`) with the line each first came from."""

    def __init__(self, path: str | Path, field: str):
        self.path, self.field = path, field
        self.seen: dict[str, tuple[Any, int | None]] = {}

    def add(self, value: Any, line: int | None) -> str:
        """`check_name(value)`, after checking no other spelling of it came before."""
        text = check_name(value, self.path, line, self.field)
        first = self.seen.setdefault(text.lower(), (value, line))
        if first[0] != value or type(first[0]) is not type(value):
            where = f"line {first[1]}" if first[1] is not None else "an earlier row"
            raise DataError(self.path, line, self.field, f"{value!r} and {first[0]!r} ({where}) would share one "
                            "folder; spell each name one way (names are case-sensitive and a number is not a string)")
        return text


def inside(folder: Path, name: str) -> Path:
    """`folder / name` after checking the name and that the path lies inside `folder` (a ValueError otherwise)."""
    if (problem := name_problem(name, MAX_FOLDER_CHARS)) is not None:
        raise ValueError(problem)
    path = folder / name
    if path.resolve().parent != folder.resolve():
        raise ValueError(f"{path} does not lie inside {folder}")
    return path
