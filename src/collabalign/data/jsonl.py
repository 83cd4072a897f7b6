"""JSON and line-by-line JSONL reading (plain or gzip): each bad file or line is a DataError, never a crash."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from collabalign.data.errors import DataError, unreadable

GZIP_MAGIC = b"\x1f\x8b"


def open_maybe_gzip(path: str | Path) -> IO[bytes]:
    """Open a file for binary reading, decompressing when it starts with the gzip magic bytes (whatever its name);
    a file that cannot be opened is a DataError naming it."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        return gzip.open(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")
    except OSError as err:
        raise unreadable(path, err) from err


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
    except (json.JSONDecodeError, RecursionError):
        return DataError(path, lineno, None, "invalid JSON")
    if not isinstance(obj, dict):
        return DataError(path, lineno, None, "not a JSON object")
    return obj


def read_json(path: str | Path) -> Any:
    """A whole JSON file (a byte-order mark allowed); unreadable, non-UTF-8 or invalid JSON is a DataError naming the
    file (and, for a syntax error, its line)."""
    try:
        with open_maybe_gzip(path) as f:
            text = f.read().decode("utf-8-sig")
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(path, None, None, f"unreadable compressed data ({err})") from err
    except UnicodeDecodeError as err:
        raise DataError(path, None, None, "not valid UTF-8") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path, err.lineno, None, f"invalid JSON ({err.msg})") from err
    except RecursionError as err:
        raise DataError(path, None, None, "invalid JSON (nested too deeply)") from err
