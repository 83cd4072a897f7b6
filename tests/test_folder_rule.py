"""The one folder rule (`folders.claimed_folder`) every writing command goes through: which folders each command may
write into, what it records there, and what a failed command leaves behind."""

import json

import pytest
import yaml

from collabalign.config import ConfigError
from collabalign.folders import OWNER_FILE, claimed_folder
from collabalign.runs import RunDir, fingerprint


def owner(folder):
    return json.loads((folder / OWNER_FILE).read_text())


def test_a_new_folder_is_claimed_recorded_and_discarded_on_failure(tmp_path):
    with claimed_folder(tmp_path / "a" / "run", "train") as claim:
        assert claim.fresh and claim.created and owner(claim.path) == {"command": "train", "key": None}
        (claim.path / "half-written").write_text("x")
        claim.discard()
    assert not (tmp_path / "a" / "run").exists() and (tmp_path / "a").is_dir()
    (tmp_path / "empty").mkdir()
    with claimed_folder(tmp_path / "empty", "train") as claim:
        (claim.path / "half-written").write_text("x")
        claim.discard()  # an existing empty folder is left empty, not removed
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())


def test_train_writes_only_into_a_new_or_empty_folder(tmp_path):
    with claimed_folder(tmp_path / "run", "train"):
        (tmp_path / "run" / "manifest.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds a trained run"), claimed_folder(tmp_path / "run", "train"):
        pass
    killed = tmp_path / "killed"  # a train killed before it saved anything: only its owner file
    killed.mkdir()
    (killed / OWNER_FILE).write_text(json.dumps({"command": "train", "key": None}))
    with claimed_folder(killed, "train") as claim:
        assert claim.fresh


def test_a_run_continues_its_own_config_and_needs_force_for_another(tmp_path):
    with claimed_folder(tmp_path / "run", "run", "key-a") as claim:
        assert claim.fresh
        (claim.path / "metrics.jsonl").write_text("")
    with claimed_folder(tmp_path / "run", "run", "key-a") as claim:
        assert not claim.fresh and not claim.replaced
    with pytest.raises(ConfigError, match="holds a run of another config; choose another folder, or --force"), \
            claimed_folder(tmp_path / "run", "run", "key-b"):
        pass
    with claimed_folder(tmp_path / "run", "run", "key-b", force=True) as claim:
        assert claim.replaced and owner(claim.path)["key"] == "key-b"
    with claimed_folder(tmp_path / "run", "resume") as claim:  # no key of its own: the folder's stays
        assert not claim.replaced and owner(claim.path) == {"command": "run", "key": "key-b"}


def test_a_run_folder_from_before_owner_files_is_keyed_by_its_config(tmp_path):
    config = {"experiment": "quickstart", "seed": 1}
    RunDir(tmp_path / "old").write_config(config)
    with claimed_folder(tmp_path / "old", "resume") as claim:
        assert owner(claim.path) == {"command": "run", "key": fingerprint(config)}
    with claimed_folder(tmp_path / "old", "run", fingerprint(config)) as claim:
        assert not claim.replaced  # the same config: its checkpoints are kept
    with pytest.raises(ConfigError, match="another config"), claimed_folder(tmp_path / "old", "run", "other"):
        pass


@pytest.mark.parametrize(("made_by", "command"), [("train", "deploy"), ("train", "run"), ("deploy", "train"),
                                                  ("run", "deploy"), ("demo", "report"), ("user", "deploy"),
                                                  ("user", "report"), ("user", "demo")])
def test_no_command_writes_into_a_folder_another_kind_of_command_made(made_by, command, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "result.txt").write_text("mine")
    if made_by != "user":
        (folder / OWNER_FILE).write_text(json.dumps({"command": made_by, "key": None}))
    before = sorted(p.name for p in folder.iterdir())
    made = "not written by collabalign" if made_by == "user" else f"made by `{made_by}`"
    with pytest.raises(ConfigError, match=f"holds files {made} \\(result.txt\\)"), claimed_folder(folder, command):
        pass
    assert sorted(p.name for p in folder.iterdir()) == before and (folder / "result.txt").read_text() == "mine"


def test_report_takes_a_folder_of_runs_and_a_damaged_owner_file_is_refused(tmp_path):
    RunDir(tmp_path / "runs" / "a").write_config({"experiment": "quickstart"})
    with claimed_folder(tmp_path / "runs", "report") as claim:
        assert owner(claim.path)["command"] == "reproduce"
    (tmp_path / "runs" / OWNER_FILE).write_text(yaml.safe_dump(["not", "an", "owner"]))
    with pytest.raises(ConfigError, match="damaged"), claimed_folder(tmp_path / "runs", "report"):
        pass
