"""Shared by the reproduction tests: a quick config with toy overrides, run twice (determinism checks)."""

from collabalign.cli import main
from collabalign.commands import config_path


def run_twice(tmp_path_factory, name: str, overrides: list[str]) -> list:
    """Two run directories of the same experiment, config and seed."""
    outs = [tmp_path_factory.mktemp(name) for _ in range(2)]
    for out in outs:
        assert main(["run", str(config_path(name, quick=True)), *overrides, "--out", str(out)]) == 0
    return outs
