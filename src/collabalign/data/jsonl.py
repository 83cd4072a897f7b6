"""Line-by-line JSONL reading (plain or gzip) that turns each bad line into a DataError instead of a crash."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from collabalign.data.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"


def open_maybe_gzip(path: str | Path) -> IO[bytes]:
    """Open a file for binary reading, decompressing when it starts with the gzip magic bytes (whatever its name)."""
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield (1-based line, JSON object or the DataError for that line); blank lines are not rows and are skipped.

    Errors are yielded rather than raised so a caller can either raise them or count them (drop_invalid).
    """
    with open_maybe_gzip(path) as f:
        lineno = 0
        try:
            for lineno, raw in enumerate(f, start=1):
                if raw.strip():
                    yield lineno, _parse_line(path, lineno, raw)
        except (OSError, EOFError, zlib.error) as err:  # truncated or corrupt gzip stream
            raise DataError(path, lineno + 1, None, f"unreadable compressed data ({err})") from err


def _parse_line(path: str | Path, lineno: int, raw: bytes) -> dict[str, Any] | DataError:
    """Decode and parse one line, returning a DataError describing why it is not a JSON object."""
    try:
        text = raw.decode("utf-8-sig")  # -sig: tolerate a byte-order mark on line 1
    except UnicodeDecodeError:
        return DataError(path, lineno, None, "not valid UTF-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return DataError(path, lineno, None, "invalid JSON")
    if not isinstance(obj, dict):
        return DataError(path, lineno, None, "not a JSON object")
    return obj
