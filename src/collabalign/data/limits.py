"""How much a data file may hold, so that no file (a gzip bomb, /dev/zero, one endless line, a flood of blank lines,
an .npz that inflates to gigabytes) can exhaust memory or time: one clear DataError past a limit instead.

The limits apply to every user data file (JSONL, gzip or not, and AffPCL's .npz); each can be raised for a big data
set through an environment variable:

- COLLABALIGN_MAX_LINE_BYTES   one JSONL line, in bytes (default 1 MiB)
- COLLABALIGN_MAX_DATA_BYTES   a file's decompressed bytes (default 1 GiB; an .npz: its arrays' bytes)
- COLLABALIGN_MAX_BLANK_LINES  blank lines in one file (default 100,000)

Texts are also cut to `max_chars(max_length)` characters before tokenising (`cut_texts`): a model reads at most
`max_length` tokens, and no token spans more than a few dozen characters.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from collabalign.config import ConfigError, short

CHARS_PER_TOKEN = 32  # a bound on the characters one token covers, for cutting texts before tokenising


@dataclass(frozen=True)
class ReadLimits:
    """The bounds every data reader applies (see the module doc)."""

    line_bytes: int = 1 << 20
    data_bytes: int = 1 << 30
    blank_lines: int = 100_000


_VARIABLES = {"line_bytes": "COLLABALIGN_MAX_LINE_BYTES", "data_bytes": "COLLABALIGN_MAX_DATA_BYTES",
              "blank_lines": "COLLABALIGN_MAX_BLANK_LINES"}


def read_limits() -> ReadLimits:
    """The defaults, each overridden by its environment variable when set (a positive integer, else a ConfigError)."""
    values = {}
    for field, variable in _VARIABLES.items():
        text = os.environ.get(variable)
        if text is None:
            continue
        try:
            values[field] = int(text.replace("_", ""))
        except ValueError:
            values[field] = 0
        if values[field] <= 0:
            raise ConfigError(f"${variable} = {short(text)}: must be a positive integer")
    return ReadLimits(**values)


def max_chars(max_length: int) -> int:
    """How many characters of a text can matter to a model that reads `max_length` tokens of it."""
    return max_length * CHARS_PER_TOKEN


def cut_texts(texts: Sequence[str] | None, max_length: int, keep: str = "end") -> list[str] | None:
    """`texts` cut to `max_chars(max_length)` characters each, keeping the `keep` end ("end" where truncation drops
    a text's start, "start" where it drops the end): what the tokenizer would keep is unchanged, and a text of
    millions of characters costs no more than a long one."""
    if texts is None:
        return None
    limit = max_chars(max_length)
    return [t if len(t) <= limit else (t[-limit:] if keep == "end" else t[:limit]) for t in texts]
