"""The one error type for bad input data, so every loader reports the same file/line/field triple."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """A malformed input row: names the file, 1-based line (or record) and field so it can be fixed at the source."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        what = self.message if self.field is None else f"field {self.field!r}: {self.message}"
        return f"{where}: {what}"

    def __reduce__(self) -> tuple[type[DataError], tuple[str, int | None, str | None, str]]:
        return type(self), (self.path, self.line, self.field, self.message)


class PromptError(ValueError):
    """A prompt a policy cannot take (too long for its `max_prompt_tokens`, or no tokens): the user's to fix."""


def unreadable(path: str | Path, err: OSError) -> DataError:
    """The DataError for a data file that cannot be read at all: missing, a folder, not permitted, or corrupt."""
    return DataError(path, None, None, "no such file" if isinstance(err, FileNotFoundError)
                     else f"cannot read ({err.strerror or err})")
