"""JSON and line-by-line JSONL reading (plain or gzip), bounded by `data.limits`: each bad file or line is a
DataError, never a crash, and no file can exhaust memory or time."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from collabalign.data.errors import DataError, unreadable
from collabalign.data.limits import ReadLimits, read_limits

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


def read_jsonl(path: str | Path, limits: ReadLimits | None = None) -> Iterator[tuple[int, dict[str, Any] | DataError]]:
    """Yield (1-based line, JSON object or the DataError for that line); blank lines are not rows and are skipped.

    Errors are yielded rather than raised so a caller can either raise them or count them (drop_invalid). Past a
    limit (`data.limits`: a line's bytes, the file's decompressed bytes, its blank lines) the read stops with a
    raised DataError.
    """
    limits = limits or read_limits()
    with open_maybe_gzip(path) as f:
        lineno = total = blank = 0
        try:
            while raw := f.readline(limits.line_bytes + 1):
                lineno += 1
                total += len(raw)
                _check_bounds(path, lineno, raw, total, limits)
                if raw.strip():
                    yield lineno, _parse_line(path, lineno, raw)
                elif (blank := blank + 1) > limits.blank_lines:
                    raise DataError(path, lineno, None, f"more than {limits.blank_lines:,} blank lines "
                                    "(COLLABALIGN_MAX_BLANK_LINES)")
        except (OSError, EOFError, zlib.error) as err:  # truncated or corrupt gzip stream
            raise DataError(path, lineno + 1, None, f"unreadable compressed data ({err})") from err


def _check_bounds(path: str | Path, lineno: int, raw: bytes, total: int, limits: ReadLimits) -> None:
    """A DataError when the line just read is longer than a line may be, or the file so far bigger than a file."""
    if len(raw) > limits.line_bytes and not raw.endswith(b"\n"):
        raise DataError(path, lineno, None, f"line longer than {limits.line_bytes:,} bytes "
                        "(COLLABALIGN_MAX_LINE_BYTES)")
    if total > limits.data_bytes:
        raise DataError(path, lineno, None, f"more than {limits.data_bytes:,} bytes of data, decompressed "
                        "(COLLABALIGN_MAX_DATA_BYTES)")


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
    """A whole JSON file (a byte-order mark allowed); unreadable, non-UTF-8, invalid JSON or bigger than the data limit
    is a DataError naming the file (and, for a syntax error, its line)."""
    limit = read_limits().data_bytes
    try:
        with open_maybe_gzip(path) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise DataError(path, None, None, f"more than {limit:,} bytes of data, decompressed "
                            "(COLLABALIGN_MAX_DATA_BYTES)")
        text = data.decode("utf-8-sig")
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
