"""What the code cites lives in the repository: no pointer outside it, and every section a module cites ("spec §N" in a
method's packages, "docs/methods/<method>.md §N" anywhere) is a numbered heading of that method's document."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "methods"
PACKAGES = {"pshare_lora": "pshare-lora", "firm": "firm", "fslora": "fslora", "meta_reward": "meta-reward",
            "affpcl": "affpcl"}
SOURCES = [p for folder in ("src", "tests", "benchmarks") for p in sorted((ROOT / folder).rglob("*"))
           if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts]
SECTION = r"§\s?(\d+(?:\.\d+)?)"


def headings(method: str) -> set[str]:
    """The section numbers of docs/methods/<method>.md: '## 3.', '### 3.1', and the numbered items of §9 lists."""
    text = (DOCS / f"{method}.md").read_text()
    numbers = set(re.findall(r"^#{2,4} (\d+(?:\.\d+)?)\.?\s", text, flags=re.M))
    return numbers | {n.rstrip(".") for n in re.findall(r"^#{2,4} (\d+\.)\s", text, flags=re.M)}


def method_of(path: Path) -> str | None:
    parts = set(path.relative_to(ROOT).parts) | {path.stem}
    return next((m for package, m in PACKAGES.items() if package in parts or m in parts), None)


def citations(path: Path) -> list[tuple[str, str]]:
    """(method, section) for each section the file cites."""
    text, out = path.read_text(), []
    for method, sections in re.findall(r"docs/methods/([a-z-]+)\.md ((?:§\s?[\d.]+[,\s-]*(?:and\s)?)+)", text):
        out += [(method, s.rstrip(".")) for s in re.findall(SECTION, sections)]
    if (method := method_of(path)) is not None:
        for sections in re.findall(r"\bspec:? ((?:§\s?[\d.]+(?: R\d)?[,\s-]*(?:and\s)?)+)", text):
            out += [(method, s.rstrip(".")) for s in re.findall(SECTION, sections)]
    return out


def test_the_code_points_nowhere_outside_the_repository():
    pointer = re.compile(r"\.\./shared/(specs|seeds)|DESIGN\.md")
    outside = [str(p.relative_to(ROOT)) for p in SOURCES
               if p.name != Path(__file__).name and pointer.search(p.read_text())]
    assert not outside


@pytest.mark.parametrize("method", sorted(PACKAGES.values()))
def test_every_cited_section_is_a_heading_of_the_method_document(method):
    cited = {(str(p.relative_to(ROOT)), s) for p in SOURCES for m, s in citations(p) if m == method}
    assert cited, f"nothing cites docs/methods/{method}.md"
    known = headings(method)
    missing = sorted((path, s) for path, s in cited if s not in known)
    assert not missing, f"sections of docs/methods/{method}.md cited but not there: {missing}"
