"""The layers of docs/architecture.md, read from the source: imports point down only, no import cycles (lazy imports
included), no method package imports another, and no verdict is decided outside claims.py."""

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "collabalign"
# lower number = lower layer; a module may import its own layer or below
LAYERS = {"comm": 0, "config": 0, "runs": 0, "claims": 0, "seeding": 0, "plotting": 0, "fits": 0, "examples": 0,
          "registry": 0, "folders": 0,
          "selection": 0, "lora": 1, "data": 1, "artifacts": 1, "models": 2, "federation": 2, "policy": 3,
          "baselines": 3, "methods": 4,
          "experiments": 5, "report": 6, "app": 6, "jobs": 6, "deployment": 6, "demo": 6,
          "commands": 7, "cli": 7}
SHARED_METHODS = {"fedavg", "reward_trainer", "policy_trainer", "drift"}  # methods/*.py modules every method builds on


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """collabalign modules imported anywhere in the file (module level or inside functions)."""
    out = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("collabalign")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base
                                                                                                   else []))
            if base.startswith("collabalign"):
                out.add(base)
                out |= {f"{base}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in SRC.rglob("*.py")}
    return {m: {i for i in imports(p) if i in files and i != m} for m, p in files.items()}


def top(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_imports_point_down_only():
    bad = [f"{m} -> {i}" for m, deps in graph().items() for i in deps
           if top(m) in LAYERS and top(i) in LAYERS and LAYERS[top(i)] > LAYERS[top(m)]]
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_no_method_package_imports_another():
    def package(m: str) -> str | None:
        parts = m.split(".")
        return parts[2] if len(parts) > 2 and parts[1] == "methods" and parts[2] not in SHARED_METHODS else None

    bad = [f"{m} -> {i}" for m, deps in graph().items() for i in deps
           if package(m) and package(i) and package(m) != package(i)]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    g = graph()
    # a package's __init__ importing its own submodules is how packages re-export: not a cycle of design
    edges = {m: {i for i in deps if not (m + ".").startswith(i + ".") and not i.startswith(m + ".")}
             for m, deps in g.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]) if nxt in stack else nxt)
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


VERDICT = re.compile(r"""["'](reproduced|not reproduced|inconclusive)["']""")


@pytest.mark.parametrize("path", sorted(p for p in SRC.rglob("*.py") if p.name != "claims.py"),
                         ids=lambda p: str(p.relative_to(SRC)))
def test_verdicts_are_decided_only_in_claims(path):
    assert not VERDICT.search(path.read_text()), f"{path.relative_to(SRC)} names a verdict: decide it in claims.py"
