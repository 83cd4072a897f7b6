"""The one folder rule of every command that writes (`run`, `resume`, `report`, `reproduce`, `train`, `deploy`,
`demo`): a lock held for the whole command, and a folder that holds anything the command did not write refused, both
before any model loads or any file is removed."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collabalign.config import ConfigError
from collabalign.runs import RunDir, atomic_write_text, fingerprint

OWNER_FILE = ".collabalign"  # in every folder a command writes: which command wrote it, for what (JSON)
# the owners of the folders each command writes into; a new or empty folder becomes the first's
OWNERS = {"run": ("run",), "resume": ("run",), "report": ("run", "reproduce"), "reproduce": ("reproduce",),
          "train": ("train",), "deploy": ("deploy",), "demo": ("demo",)}


@dataclass
class Claim:
    """A folder a command holds (`claimed_folder`): `fresh` when it was new or empty; `replaced` when it held the
    command's own kind of run of another key (reused by `force`)."""

    path: Path
    fresh: bool
    created: bool
    replaced: bool

    def discard(self) -> None:
        """Removes what the command wrote into a fresh folder (the folder too, when the command created it): a
        failed command leaves nothing behind."""
        if not self.fresh:
            return
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        for child in self.path.iterdir():
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() and not child.is_symlink() else child.unlink()


@contextmanager
def claimed_folder(path: Path, command: str, key: str | None = None, force: bool = False) -> Iterator[Claim]:
    """The one folder rule of every command that writes (`OWNERS`): holds the folder's lock for the block, after
    checking, before any model is loaded or any file removed, that `path` can be created and written and that it is
    new, empty, or a folder of an owner the command writes into (its `OWNER_FILE`; a folder from before owner files
    by its config.yaml). One holding a run of another `key` (a different config) is refused unless `force`; `train`
    never writes into a folder that holds a run. Every refusal is one ConfigError and changes nothing."""
    owners = OWNERS[command]
    created = not path.exists() and not path.is_symlink()
    with locked_folder(path):
        owner = _owner(path)
        empty = not [p for p in path.iterdir() if p.name != OWNER_FILE]
        fresh = empty and (owner is None or owner["command"] in owners)
        if not fresh:
            _check_owner(path, command, owner, key, force)
        replaced = not fresh and key is not None and owner["key"] not in (None, key)
        if fresh or replaced or not (path / OWNER_FILE).is_file():  # a command without a key keeps the folder's
            record = {"command": owners[0], "key": key} if fresh else {**owner, "key": key or owner["key"]}
            atomic_write_text(path / OWNER_FILE, json.dumps(record) + "\n")
        yield Claim(path, fresh, created, replaced)


def _owner(path: Path) -> dict[str, Any] | None:
    """What the folder's owner file says (None without one). A folder from before owner files: a run folder
    (config.yaml: `run`'s, keyed by its config) or a folder of them (`reproduce`'s)."""
    file = path / OWNER_FILE
    if file.is_file():
        try:
            owner = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            owner = None
        if not isinstance(owner, dict) or owner.get("command") not in OWNERS or not isinstance(owner.get("key"),
                                                                                             str | None):
            raise ConfigError(f"{file}: damaged; delete the folder's files or choose another folder")
        return owner
    if (path / "config.yaml").is_file():
        return {"command": "run", "key": fingerprint(RunDir(path, create=False).read_config())}
    if any(path.glob("*/config.yaml")):
        return {"command": "reproduce", "key": None}
    return None


def _check_owner(path: Path, command: str, owner: dict[str, Any] | None, key: str | None, force: bool) -> None:
    """A ConfigError unless `command` may write into the folder `path` that `owner` wrote."""
    owners = OWNERS[command]
    if owner is None or owner["command"] not in owners:
        shown = ", ".join(sorted(p.name for p in path.iterdir() if p.name != OWNER_FILE)[:3])
        made = f"made by `{owner['command']}`" if owner else "not written by collabalign"
        raise ConfigError(f"{path}: holds files {made} ({shown}); `{command}` writes only into a new or empty folder"
                          f"{'' if command == 'train' else ' or one of its own'}: choose another folder")
    if command == "train":
        raise ConfigError(f"{path}: holds a trained run; choose another --out (a trained result is never "
                          "overwritten)")
    if key is not None and owner["key"] not in (None, key) and not force:
        raise ConfigError(f"{path}: holds a {owner['command']} of another config; choose another folder"
                          f"{', or --force to reuse it' if command == 'run' else ''}")


@contextmanager
def locked_folder(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on the run folder `path` (created when missing) for the block, so one process at a time
    writes it. A second one is refused with a ConfigError and changes nothing; the OS releases the lock when its
    holder exits, so the lock of a killed process is taken over. A file, a dangling link, a place below a file, or a
    folder that cannot be written is a ConfigError too."""
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{path}: a link to nothing; choose another folder")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: a file, not a folder; choose another folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        raise ConfigError(f"{path}: cannot create or open the run folder ({err.strerror})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{path}: in use by {_lock_holder(path)}; wait for it to end, or choose another "
                              "folder") from None
        _check_writable(path)
        yield
    finally:
        os.close(fd)


def _check_writable(path: Path) -> None:
    """A ConfigError unless a file can be created in the folder `path` (whatever the reason: mode, owner,
    immutable flag, read-only file system)."""
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError as err:
        raise ConfigError(f"{path}: the run folder is not writable ({err.strerror})") from None


def _lock_holder(path: Path) -> str:
    """'process PID' of the process holding the lock on `path` where Linux's /proc/locks tells, else a vaguer name."""
    inode = f":{path.stat().st_ino} "
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        lines = []
    pids = [line.split()[4] for line in lines if "FLOCK" in line and inode in line]
    return f"process {pids[0]}" if pids else "another process"
