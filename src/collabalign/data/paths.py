"""Where the shared real datasets live, so tests and experiments can find them or skip cleanly."""

from __future__ import annotations

import os
from pathlib import Path

from collabalign.config import ConfigError


def shared_data_dir() -> Path | None:
    """$COLLABALIGN_DATA if set (it must be an existing folder: a typo must not silently mean "no data"), else
    ../shared/data beside the project root (holding pyproject.toml), else None."""
    env = os.environ.get("COLLABALIGN_DATA")
    if env:
        if not Path(env).is_dir():
            raise ConfigError(f"$COLLABALIGN_DATA = {env!r}: not an existing directory")
        return Path(env)
    for parent in Path(__file__).resolve().parents:
        if (parent / "pyproject.toml").is_file():
            candidate = parent.parent / "shared" / "data"
            return candidate if candidate.is_dir() else None
    return None
