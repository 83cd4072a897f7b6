"""pyproject.toml declares every third-party package the source imports, and requirements.txt's exact pins
satisfy those ranges (so `pip install collabalign` gives an importable package and `make` a tested one)."""

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"datasets"}  # imported lazily by the hub loaders only, declared in the `hub` extra
# modules that come with a declared distribution rather than under their own name
BUNDLED = {"cryptography": "flwr", "ray": "flwr", "sklearn": "scikit-learn", "yaml": "pyyaml"}


def declared() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    return {r.name.lower(): r for r in reqs}


def imported_top_levels() -> set[str]:
    names = set()
    for path in (ROOT / "src" / "collabalign").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"collabalign", "__future__"}


def test_every_imported_package_is_declared():
    deps = declared()
    missing = []
    for name in sorted(imported_top_levels()):
        dist = BUNDLED.get(name, name).lower().replace("_", "-")
        if dist not in deps and name not in OPTIONAL:
            missing.append(name)
    assert not missing, f"imported but not in pyproject dependencies: {missing}"


def test_pins_satisfy_the_declared_ranges():
    deps = declared()
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            req = Requirement(line)
            pins[req.name.lower()] = next(iter(req.specifier)).version
    for name, req in deps.items():
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {req}"
        elif name not in OPTIONAL:
            raise AssertionError(f"{name} is declared but not pinned in requirements.txt")


def test_installed_versions_match_the_pins():
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith(("torch==", "flwr==", "transformers==", "numpy==")):
            req = Requirement(line)
            assert metadata.version(req.name) in req.specifier
