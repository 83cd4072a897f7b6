"""Round checkpoints without pickle: a tree of dicts, lists, scalars and numpy arrays is stored as one safetensors
file (the arrays) plus one JSON file (the tree, arrays replaced by their names), both written atomically.

`Checkpoint(folder)` keeps the latest round's state of one federated run and appends each round's log line (metric
record, ledger rows, timing, faults) as the round ends, so a killed run loses at most the round in flight and
`resume` continues from the last completed round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save

from collabalign.runs import atomic_write_bytes, atomic_write_text

_ARRAY = "__array__"  # a JSON leaf {"__array__": name} stands for an array in the safetensors file
_TUPLE = "__tuple__"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read back (missing file, foreign content)."""


def flatten(tree: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
    """The JSON skeleton of `tree`, collecting its arrays (numpy, or numpy scalars) into `arrays` by path."""
    if isinstance(tree, np.ndarray | np.generic):
        name = path or "root"
        arrays[name] = np.ascontiguousarray(np.asarray(tree))
        return {_ARRAY: name, "scalar": isinstance(tree, np.generic)}
    if isinstance(tree, dict):
        if not all(isinstance(k, str) for k in tree):
            raise TypeError(f"checkpoint: dict keys must be strings at {path or 'root'}")
        return {"dict": {k: flatten(v, arrays, f"{path}/{k}") for k, v in tree.items()}}
    if isinstance(tree, list | tuple):
        items = [flatten(v, arrays, f"{path}[{i}]") for i, v in enumerate(tree)]
        return {_TUPLE: items} if isinstance(tree, tuple) else {"list": items}
    if tree is None or isinstance(tree, bool | int | float | str):
        return {"value": tree}
    raise TypeError(f"checkpoint: cannot store a {type(tree).__name__} at {path or 'root'}")


def unflatten(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of `flatten`."""
    if _ARRAY in node:
        value = arrays[node[_ARRAY]]
        return value[()] if node["scalar"] else value
    if "dict" in node:
        return {k: unflatten(v, arrays) for k, v in node["dict"].items()}
    if "list" in node:
        return [unflatten(v, arrays) for v in node["list"]]
    if _TUPLE in node:
        return tuple(unflatten(v, arrays) for v in node[_TUPLE])
    return node["value"]


class Checkpoint:
    """One run's latest completed round: ``state.safetensors`` + ``state.json`` (server and client state, replaced
    each round) and ``rounds.jsonl`` (one line appended per round: its ledger rows, timing, faults and metric
    record), so a save costs the state's size, not the run's length."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)

    @property
    def exists(self) -> bool:
        return (self.folder / "state.json").exists()

    def save(self, round_: int, tree: Any) -> None:
        """Stores `tree` as round `round_`; the JSON is replaced last, so a crash mid-save keeps the previous round
        readable (the JSON names the arrays file of its own round)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        skeleton = flatten(tree, arrays)
        name = f"state-{round_:05d}.safetensors"
        atomic_write_bytes(self.folder / name, save(arrays))
        previous = self._arrays_file()
        atomic_write_text(self.folder / "state.json", json.dumps({"round": round_, "arrays": name, "tree": skeleton}))
        if previous is not None and previous.name != name:
            previous.unlink(missing_ok=True)

    def load(self) -> tuple[int, Any, list[dict[str, Any]]]:
        """(round, state tree, the log lines of rounds 0..round)."""
        try:
            index = json.loads((self.folder / "state.json").read_text())
            tree = unflatten(index["tree"], load_file(str(self.folder / index["arrays"])))
            lines = (self.folder / "rounds.jsonl").read_text().splitlines()
            log = [r for r in map(json.loads, lines) if r["round"] <= index["round"]]
        except (OSError, ValueError, KeyError, SafetensorError) as err:
            raise CheckpointError(f"{self.folder}: unreadable checkpoint: {err}") from None
        if [r["round"] for r in log] != list(range(index["round"] + 1)):
            raise CheckpointError(f"{self.folder}: rounds.jsonl does not hold rounds 0..{index['round']}")
        return index["round"], tree, log

    def _arrays_file(self) -> Path | None:
        try:
            return self.folder / json.loads((self.folder / "state.json").read_text())["arrays"]
        except (OSError, ValueError, KeyError):
            return None

    def append(self, record: dict[str, Any]) -> None:
        """One round's log line, written and flushed as the round ends."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "rounds.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def reset(self, log: list[dict[str, Any]]) -> None:
        """rounds.jsonl cut back to `log` (the checkpointed rounds) before a resumed run appends."""
        atomic_write_text(self.folder / "rounds.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in log))
