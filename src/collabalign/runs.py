"""Run directories: config snapshot (+ versions, git hash), metrics.jsonl, ledger.csv, summary.json,
plots/ and report.md. Every file is written atomically (temp file + rename)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from collabalign.comm import Ledger
from collabalign.config import ConfigError, cut

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # the process's umask, read once (os has no getter)
_TRACKED_PACKAGES = ("torch", "numpy", "transformers", "peft", "flwr", "pydantic")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Writes `data` so that readers see either the old file or the whole new one (mode 0666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp creates 0600; output files are as readable as any other file
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    """`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def fingerprint(settings: Any) -> str:
    """A short hash of JSON-able settings: every setting that changes a cached result's numbers."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def read_cached(path: str | Path, key: str) -> dict[str, Any] | None:
    """What `cached_json` saved at `path` under the fingerprint `key`; None when nothing is saved there under it."""
    path = Path(path)
    if not path.exists():
        return None
    saved = json.loads(path.read_text())
    return saved if saved.pop("fingerprint", None) == key else None


def cached_json(path: str | Path, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """compute()'s result (JSON-able) saved at `path` under the fingerprint `key`, or read from there when a
    computation with the same key finished before: a run killed midway, or split across processes into one folder,
    continues to the same results without repeating finished work."""
    if (saved := read_cached(path, key)) is not None:
        return saved
    out = compute()
    atomic_write_text(Path(path), json.dumps(out | {"fingerprint": key}))
    return json.loads(json.dumps(out))  # as a later read gives it back (tuples as lists, keys as strings)


def environment() -> dict[str, Any]:
    """Package versions and the git commit of the working tree (None outside a repo)."""
    versions = {}
    for name in _TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        git = None
    return {"versions": versions, "git": git}


def metric_line(record: dict[str, Any]) -> str:
    """A metric record as one line of JSON, keys sorted. Valid JSON always: a non-finite float is written as null and
    its key (dotted when nested) listed under ``nonfinite``; a record without one is written as it is."""
    found: list[str] = []
    nulled = _null_nonfinite(record, "", found)
    return json.dumps(nulled | {"nonfinite": sorted(found)} if found else record, sort_keys=True)


def _null_nonfinite(value: Any, path: str, found: list[str]) -> Any:
    """`value` with every non-finite float replaced by None, the path of each appended to `found`."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return None
    if isinstance(value, dict):
        return {k: _null_nonfinite(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_null_nonfinite(v, f"{path}.{i}", found) for i, v in enumerate(value)]
    return value


@dataclass
class Part:
    """What one part of a reproduction adds to its run: claim records (from `claims.py`), metric records, summary
    metrics, report notes."""

    claims: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


_ACTIVE: ContextVar[RunDir | None] = ContextVar("collabalign_active_run", default=None)
STATUSES = ("running", "finished", "failed")


class RunDir:
    """One experiment's output folder."""

    def __init__(self, path: str | Path, create: bool = True):
        """The folder `path`, created with its plots/ unless `create` is false (to read a run without touching it)."""
        self.path = Path(path)
        if create:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "plots").mkdir(exist_ok=True)
        self._calls = 0

    @contextmanager
    def active(self) -> Iterator[RunDir]:
        """Makes this the run that federated simulations checkpoint into (see `next_checkpoint`)."""
        token, self._calls = _ACTIVE.set(self), 0
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def next_checkpoint(self, label: str) -> Path:
        """The checkpoint folder of the run's next simulation, numbered in call order: a config runs its simulations
        in the same order every time, so a resumed run finds each one's folder again."""
        self._calls += 1
        return self.path / "checkpoints" / f"{self._calls:04d}-{re.sub(r'[^A-Za-z0-9_.=+-]+', '_', label)[:80]}"

    def write_status(self, status: str, error: str | None = None) -> None:
        """status.json: running / finished / failed (with the error's one-line reason)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        record = {"status": status, "error": error, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_text(self.path / "status.json", json.dumps(record, indent=2))

    def read_status(self) -> dict[str, Any]:
        """The run's status record ({} for a folder written before status files existed)."""
        status = self._read("status.json", json.loads, {})
        if not isinstance(status, dict):
            raise ConfigError(f"{self.path / 'status.json'}: not a status record; restore or delete it")
        return status

    def saved_status(self) -> bytes | None:
        """status.json's bytes (None when there is none), for `restore_status`."""
        path = self.path / "status.json"
        return path.read_bytes() if path.exists() else None

    def restore_status(self, saved: bytes) -> None:
        """status.json as `saved_status` read it."""
        atomic_write_bytes(self.path / "status.json", saved)

    def write_config(self, config: dict[str, Any]) -> None:
        snapshot = {"config": config, "environment": environment()}
        atomic_write_text(self.path / "config.yaml", yaml.safe_dump(snapshot, sort_keys=False))

    def read_config(self) -> dict[str, Any]:
        """The run's config as written by `write_config` ({} when there is none)."""
        snapshot = self._read("config.yaml", yaml.safe_load, {"config": {}, "environment": None})
        if not isinstance(snapshot, dict) or not isinstance(snapshot.get("config"), dict) \
                or "environment" not in snapshot:  # written last: a file cut short lacks it
            raise ConfigError(f"{self.path / 'config.yaml'}: not a whole run config (config and environment "
                              "sections); restore or delete it")
        return snapshot["config"]

    def _read(self, name: str, parse: Callable[[str], Any], missing: Any) -> Any:
        """The run file `name` parsed, `missing` when it does not exist; a ConfigError when it cannot be read."""
        path = self.path / name
        if not path.exists():
            return missing
        try:
            return parse(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, yaml.YAMLError) as err:
            problem = cut(" ".join(str(err).split()), 120)
            raise ConfigError(f"{path}: unreadable ({problem}); restore or delete it") from None

    def write_metrics(self, records: list[dict[str, Any]]) -> None:
        """metrics.jsonl: deterministic content only (no timings), so equal seeds give equal bytes; valid JSON
        (`metric_line`)."""
        atomic_write_text(self.path / "metrics.jsonl", "".join(metric_line(r) + "\n" for r in records))

    def read_metrics(self) -> list[dict[str, Any]]:
        return self._read("metrics.jsonl", lambda text: [json.loads(line) for line in text.splitlines() if line], [])

    def write_summary(self, claims: list[dict[str, Any]], metrics: dict[str, Any], notes: list[str] | None = None,
                      plot_metrics: list[str] | None = None) -> None:
        """summary.json: claims and metrics, plus optional report notes and the metrics to plot per round."""
        extra = {k: v for k, v in (("notes", notes), ("plot_metrics", plot_metrics)) if v is not None}
        summary = {"claims": claims, "metrics": metrics, **extra}
        atomic_write_text(self.path / "summary.json", json.dumps(summary, indent=2))

    def write_parts(self, parts: list[Part], plot_metrics: list[str] | None = None) -> None:
        """A reproduction's parts, in order, as metrics.jsonl and summary.json (claims, metrics, notes)."""
        self.write_metrics([r for part in parts for r in part.records])
        metrics = {k: v for part in parts for k, v in part.metrics.items()}
        self.write_summary([c for part in parts for c in part.claims], metrics,
                           notes=[n for part in parts for n in part.notes], plot_metrics=plot_metrics)

    def read_summary(self) -> dict[str, Any]:
        return self._read("summary.json", json.loads, {})

    def write_ledgers(self, ledgers: dict[str, Ledger]) -> None:
        """ledger.csv with a method column: every message of every method's run, in bytes."""
        lines = ["method,round,client,direction,bytes"]
        lines += [f"{m},{r},{c},{d},{b}" for m, led in ledgers.items() for r, c, d, b in led.rows]
        atomic_write_text(self.path / "ledger.csv", "\n".join(lines) + "\n")

    def read_ledgers(self) -> dict[str, Ledger]:
        out: dict[str, Ledger] = {}
        path = self.path / "ledger.csv"
        if not path.exists():
            return out
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                out.setdefault(row["method"], Ledger()).record(int(row["round"]), row["client"], row["direction"],
                                                               int(row["bytes"]))
        return out

    def write_json(self, name: str, data: Any) -> None:
        atomic_write_text(self.path / name, json.dumps(data, indent=2, sort_keys=True))


def active_run() -> RunDir | None:
    """The run directory whose experiment is running in this context (None outside `RunDir.active`)."""
    return _ACTIVE.get()
