"""What crosses between parties: `Message` (named arrays + small metadata) with exact wire bytes,
and the `Ledger` that counts them per round, client and direction.

Wire format: a safetensors file whose ``__metadata__`` holds ``{"meta": <compact JSON>}``.
`Message.nbytes` is the length of exactly that serialisation; the Flower adapter sends the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

_META_KEY = "meta"

Params = dict[str, np.ndarray]  # named arrays: an adapter state, a reply, a server state


class MessageError(ValueError):
    """Bytes that are not a valid serialised Message; the message says why in one line."""


class Message(Mapping[str, np.ndarray]):
    """An ordered, immutable mapping name -> numpy array plus a JSON-able metadata dict."""

    def __init__(self, arrays: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None):
        self._arrays = {k: _contiguous(v) for k, v in (arrays or {}).items()}
        self.meta = dict(meta or {})
        self._wire: bytes | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        shapes = {k: tuple(v.shape) for k, v in self._arrays.items()}
        return f"Message({shapes}, meta={self.meta}, nbytes={self.nbytes})"

    def serialise(self) -> bytes:
        """The exact bytes sent on the wire (cached: a Message is not modified after creation)."""
        if self._wire is None:
            meta = json.dumps(self.meta, sort_keys=True, separators=(",", ":"))
            self._wire = st_save(self._arrays, metadata={_META_KEY: meta})
        return self._wire

    @property
    def nbytes(self) -> int:
        """Size of `serialise()`: arrays' bytes plus the safetensors header with the metadata."""
        return len(self.serialise())

    @property
    def array_nbytes(self) -> int:
        """Bytes of the arrays alone (no header or metadata): what papers' byte formulas count."""
        return sum(a.nbytes for a in self._arrays.values())

    @classmethod
    def deserialise(cls, data: bytes) -> Message:
        """Inverse of `serialise`, arrays sorted by name (the wire stores them sorted; safetensors' loader returns
        them in hash order, which differs between processes). Bytes that are not a message (truncated, corrupt
        header, unknown dtype, bad metadata) raise MessageError."""
        try:
            arrays = st_load(data)  # validates the header, offsets, shapes and lengths
        except SafetensorError as err:
            raise MessageError(f"not a safetensors message: {_one_line(err)}") from err
        except KeyError as err:  # a dtype safetensors knows but numpy does not (e.g. BF16)
            raise MessageError(f"unsupported dtype {err}") from err
        header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])  # valid: st_load parsed it
        try:
            meta = json.loads((header.get("__metadata__") or {}).get(_META_KEY, "{}"))
        except (json.JSONDecodeError, RecursionError) as err:
            raise MessageError(f"metadata is not valid JSON: {_one_line(err)}") from err
        if not isinstance(meta, dict):
            raise MessageError(f"metadata must be a JSON object, got {type(meta).__name__}")
        return cls({name: arrays[name] for name in sorted(arrays)}, meta)


def _contiguous(value: Any) -> np.ndarray:
    """`value` as a C-contiguous array of the same shape (np.ascontiguousarray would make a scalar 1-d)."""
    array = np.asarray(value)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


@dataclass
class Ledger:
    """Bytes per (round, client, direction); direction is 'down' (server->client) or 'up'."""

    rows: list[tuple[int, str, str, int]] = field(default_factory=list)

    def record(self, round_: int, client: str, direction: str, nbytes: int) -> None:
        if direction not in ("down", "up"):
            raise ValueError(f"direction must be 'down' or 'up', got {direction!r}")
        self.rows.append((int(round_), str(client), direction, int(nbytes)))

    def total(self, direction: str | None = None, round_: int | None = None) -> int:
        return sum(
            b for r, _, d, b in self.rows if (direction is None or d == direction) and (round_ is None or r == round_)
        )

    def per_round(self) -> dict[int, dict[str, int]]:
        """{round: {"down": bytes, "up": bytes}}."""
        out: dict[int, dict[str, int]] = {}
        for r, _, d, b in self.rows:
            out.setdefault(r, {"down": 0, "up": 0})[d] += b
        return out
