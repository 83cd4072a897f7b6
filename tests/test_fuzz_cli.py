"""Property-based fuzz of the CLI's argument and config handling, in process (800 cases): random configs,
overrides, `--out` targets and run-folder files give exit code 0 or 2, never a traceback; exit code 2 comes with one
short stderr line and leaves every existing folder as it was. The experiment itself is stubbed out."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collabalign import cli, commands
from collabalign.commands import CONFIG_DIR
from collabalign.config import MAX_OVERRIDE_CHARS, read_yaml
from collabalign.runs import RunDir
from tests.test_fuzz import VALUES, fuzz

QUICK = CONFIG_DIR / "quickstart" / "quick.yaml"
QUICK_DATA = read_yaml(QUICK)
KEYS = ["seeds", "data.source", "data.path", "data.max_pairs", "data.test_fraction", "split.clients", "split.alpha",
        "split.min_pairs", "split.attribute", "model.backbone", "model.device", "model.targets", "train.rounds",
        "train.lr", "engine.min_replies", "aggregation.rule", "experiment", "smoke", "bogus", "data.bogus.deep"]
RAW = st.sampled_from(["*a", "&a [1, *a]", "[&a 1, *a]", "{a: &a 1, b: *a}", "[" * 40, "!!python/object:os.system",
                       "cuda", "cuda:7", "banana", "meta", ".nan", "1e400", "null", "[q_proj, q_proj]", "'"])


def cases(examples: int) -> settings:
    """test_fuzz's settings; capsys is read after every case, so sharing it between cases is safe."""
    return settings(fuzz(examples), suppress_health_check=[*fuzz(examples).suppress_health_check,
                                                           HealthCheck.function_scoped_fixture])


def big(draw: st.DrawFn) -> str:
    """A long value: a string near the override limit, or a seed list with or without repeats."""
    n = draw(st.sampled_from([100, 2_000, MAX_OVERRIDE_CHARS - 20, MAX_OVERRIDE_CHARS + 1]))
    return draw(st.sampled_from(["x" * n, str(list(range(n // 6))), str([*range(n // 8), 3])]))


@st.composite
def override(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(KEYS) | st.text(max_size=6))
    kind = draw(st.sampled_from(["yaml", "raw", "big", "text"]))
    value = {"yaml": lambda: yaml.safe_dump(draw(VALUES), default_flow_style=True).strip(),
             "raw": lambda: draw(RAW), "big": lambda: big(draw), "text": lambda: draw(st.text(max_size=12))}[kind]()
    return draw(st.sampled_from([f"{key}={value}", key, f"{key}.={value}", f"={value}"])) if kind == "text" \
        else f"{key}={value}"


@st.composite
def config_text(draw: st.DrawFn) -> str:
    """The quick config with a mutated value, an alias, a huge or deep value, or cut short."""
    data = copy.deepcopy(QUICK_DATA)
    key = draw(st.sampled_from(KEYS)).split(".")
    node = data
    for part in key[:-1]:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
    node[key[-1]] = draw(VALUES)
    text = yaml.safe_dump(data, sort_keys=False)
    extra = draw(st.sampled_from(["", "anchor: &a [1, 2]\nalias: *a\n", f"bogus: '{'x' * 5_000}'\n",
                                  "deep: " + "[" * 60 + "]" * 60 + "\n", "seeds: &s [1]\nother: *s\n"]))
    text += extra
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Iterator[Path]:
    """A folder with a file, a folder of someone else's files, and a run folder; the experiment and the report are
    stubbed so an accepted command returns at once."""
    root = tmp_path_factory.mktemp("fuzz-cli")
    (root / "a-file").write_text("mine")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("mine")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(commands, "_execute", lambda run, *args: run.path / "report.md")
        mp.setattr(commands, "write_report", lambda path, title="": Path(path) / "report.md")
        mp.setattr("collabalign.runs.environment", lambda: {"versions": {}, "git": None})
        yield root


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def check(args: list[str], capsys: pytest.CaptureFixture[str], untouched: list[Path]) -> int:
    """Runs the CLI; asserts exit code 0, or 2 with one short line and every `untouched` folder as it was."""
    before = [snapshot(p) for p in untouched]
    try:
        rc = cli.main(args)
    except SystemExit as exit_:  # argparse's usage errors
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc in (0, 2), (args, err)
    if rc == 2:
        assert err.startswith("error: ") and err.count("\n") == 1 and len(err) < 1100, err[:300]
        assert [snapshot(p) for p in untouched] == before
    return rc


@cases(300)
@given(overrides=st.lists(override(), max_size=4), out=st.sampled_from(["a-file", "a-file/below", "foreign", "new"]),
       force=st.booleans())
def test_random_overrides_and_out_folders_give_exit_0_or_one_line(place, capsys, overrides, out, force):
    target = place / out if out != "new" else place / f"new-{len(os.listdir(place))}"
    args = ["run", str(QUICK), *overrides, "--out", str(target), *(["--force"] if force else [])]
    rc = check(args, capsys, [place / "foreign"] if not force else [])
    assert (place / "a-file").read_text() == "mine"
    assert rc == 2 or out in ("foreign", "new")


@cases(300)
@given(text=config_text())
def test_random_config_files_give_exit_0_or_one_line(place, capsys, text):
    path = place / "config.yaml"
    path.write_text(text)
    check(["run", str(path), "--out", str(place / "foreign")], capsys, [place / "foreign"])


@cases(200)
@given(name=st.sampled_from(["config.yaml", "status.json"]), command=st.sampled_from(["resume", "report"]),
       data=st.data())
def test_random_run_files_give_exit_0_or_one_line_and_keep_the_status(place, capsys, name, data, command):
    run = RunDir(place / "run")
    run.write_config(QUICK_DATA)
    run.write_status("running")
    whole = (run.path / name).read_bytes()
    spoilt = data.draw(st.sampled_from(["cut", "bytes", "json", "yaml"]))
    content = {"cut": lambda: whole[: data.draw(st.integers(0, len(whole) - 1))],
               "bytes": lambda: data.draw(st.binary(max_size=64)),
               "json": lambda: json.dumps(data.draw(VALUES)).encode(),
               "yaml": lambda: yaml.safe_dump(data.draw(VALUES)).encode()}[spoilt]()
    (run.path / name).write_bytes(content)
    status = (run.path / "status.json").read_bytes()
    if check([command, str(run.path)], capsys, []) == 2:
        assert (run.path / "status.json").read_bytes() == status
