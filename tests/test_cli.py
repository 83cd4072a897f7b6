"""Every user error through the CLI is one line on stderr, `error: <file>: <field>: <problem>`, and exit code 2."""

from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from collabalign import cli
from collabalign.cli import main
from collabalign.comm import MessageError
from collabalign.commands import CONFIG_DIR
from collabalign.config import ConfigError
from collabalign.data import DataError

QUICK = str(CONFIG_DIR / "quickstart" / "quick.yaml")


def one_line_error(args, capsys) -> str:
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("overrides, parts", [
    (["train.rounds=0"], [QUICK, "train.rounds = 0", "greater than 0"]),
    (["train.rounds=-3", "train.lr=.nan"], [QUICK, "train.rounds = -3", "; train.lr = nan", "finite number"]),
    (["train.batch_size=0"], [QUICK, "train.batch_size = 0"]),
    (["seeds=[0, 0]"], [QUICK, "seeds = [0, 0]", "repeated value"]),
    (["model.targets=[]"], [QUICK, "model.targets = []", "at least 1 item"]),
    (["train.lr=[1,"], ["override train.lr", "cannot parse"]),
    (["experiment=[1]"], [QUICK, "experiment = [1]"]),
])
def test_bad_values_and_overrides_are_one_line(overrides, parts, capsys, tmp_path):
    err = one_line_error(["run", QUICK, *overrides, "--out", str(tmp_path / "run")], capsys)
    assert all(p in err for p in parts), err
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize("content, message", [
    (bytes(range(256)), "not a UTF-8 text file"),
    (b"experiment: quickstart\nseeds: [0\n", "not valid YAML: line 3"),
])
def test_a_binary_or_malformed_config_file_is_one_line(content, message, capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    assert message in one_line_error(["run", str(path)], capsys)


def test_a_missing_config_file_or_a_directory_is_one_line(capsys, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert f"{missing}: no such config file" in one_line_error(["run", str(missing)], capsys)
    assert f"{tmp_path}: a directory" in one_line_error(["run", str(tmp_path)], capsys)


def test_a_missing_data_folder_is_one_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path / "absent"))
    err = one_line_error(["run", QUICK, "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert "$COLLABALIGN_DATA" in err and str(tmp_path / "absent") in err


def test_an_unknown_split_attribute_is_one_line_before_any_work(capsys, tmp_path):
    args = ["run", QUICK, "data.source=synthetic", "split.attribute=topics", "model.backbone=no-such-model",
            "--out", str(tmp_path / "run"), "--no-progress"]  # fails before the backbone is loaded
    err = one_line_error(args, capsys)
    assert "field 'topics': unknown split attribute" in err and "known: ['topic']" in err


def test_a_data_error_is_one_line(monkeypatch, capsys, tmp_path):
    folder = tmp_path / "data" / "hh-rlhf"
    folder.mkdir(parents=True)
    (folder / "harmless-base-test.jsonl.gz").write_bytes(b"\x1f\x8b not really gzip")
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path / "data"))
    err = one_line_error(["run", QUICK, "model.backbone=no-such-model", "--out", str(tmp_path / "run"),
                          "--no-progress"], capsys)
    assert f"{folder / 'harmless-base-test.jsonl.gz'}:1: unreadable compressed data" in err


def raise_(error):
    def run_config(*args, **kwargs):
        raise error
    return run_config


@pytest.mark.parametrize("error, parts", [
    (MessageError("not a safetensors message: header too small"), ["not a safetensors message"]),
    (DataError("a.jsonl", 3, "chosen", "missing field"), ["a.jsonl:3: field 'chosen': missing field"]),
    (ConfigError("x.yaml: invalid config\n  a = 1: bad\n  b = 2: worse"),
     ["x.yaml: invalid config: a = 1: bad; b = 2: worse"]),
    (None, ["int: invalid value(s): <root> = 'x'", "valid integer"]),
])
def test_every_user_error_type_is_one_line(error, parts, monkeypatch, capsys):
    if error is None:
        with pytest.raises(ValidationError) as info:
            TypeAdapter(int).validate_python("x")
        error = info.value
    monkeypatch.setattr(cli, "run_config", raise_(error))
    err = one_line_error(["run", QUICK], capsys)
    assert all(p in err for p in parts), err


def test_a_genuine_bug_still_raises(monkeypatch):
    monkeypatch.setattr(cli, "run_config", raise_(ZeroDivisionError("a bug")))
    with pytest.raises(ZeroDivisionError):
        main(["run", QUICK])


def test_every_name_list_prints_is_a_config_run_accepts(capsys):
    from collabalign.commands import load_config, resolve_config
    from collabalign.jobs import read_spec

    assert main(["list"]) == 0
    runs, deploys = capsys.readouterr().out.split("\n\n")
    names = [line.split()[0] for line in runs.splitlines()[1:]]
    assert "quickstart/quick" in names and "pshare-lora/main" in names and len(names) >= 12
    for name in names:
        experiment, *_ = load_config(resolve_config(Path(name)))
        assert experiment == name.split("/")[0]
    deployments = [line.split()[0] for line in deploys.splitlines()[1:]]
    assert "deploy/fedavg-lora" in deployments
    for name in deployments:
        assert read_spec(resolve_config(Path(name))).method == name.split("/")[1]
