"""What a careless or hostile user can type at `train`, `score`, `generate` and `deploy`: every input ends in a
result or one line with exit code 2 (never a traceback), nothing is written outside the run folder, no trained
result is lost, and what can be checked before a model loads is checked before (a model load here fails the test).
Each case was a traceback, a write outside the run folder or a lost result before these checks."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import collabalign.models.saved
import collabalign.policy.saved  # imported before `no_model` patches what they import
from collabalign import cli, jobs
from collabalign.artifacts import Adapter, Result
from collabalign.examples import write_examples
from collabalign.folders import OWNER_FILE
from tests.entry.helpers import write_jsonl

TINY = ["model=tiny-llama", "epochs=1"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> dict[str, Path]:
    return write_examples(tmp_path_factory.mktemp("examples"))


@pytest.fixture(scope="module")
def reward_run(examples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "reward"
    assert cli.main(["train", "pshare-lora", *TINY, "lr=3e-3", "--data", str(examples["pairs"]), "--out", str(out),
                     "--no-progress"]) == 0  # a given lr: lr: auto's fits are the entry point's own test
    return out


@pytest.fixture(scope="module")
def policy_run(examples, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "policy"
    assert cli.main(["train", "fed-tune", "model=tiny-llama", "rounds=1", "local_steps=1", "max_response_tokens=8",
                     "--data", str(examples["pairs"]), "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: what it guards is checked before a model loads."""
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for module in (collabalign.models.backbones, collabalign.models.saved, collabalign.policy.saved):
        monkeypatch.setattr(module, "load_backbone", load)
    monkeypatch.setattr(jobs, "build", load)


def one_line(args: list[str], capsys) -> str:
    """Runs the CLI; asserts exit code 2 with one line on stderr; returns that line."""
    try:
        code = cli.main(args)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err[-2000:]
    return err


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def pairs_with_user(user, n: int = 6) -> list[dict]:
    return [{"prompt": f"Question {i}?", "chosen": f"A kind answer {i}.", "rejected": "No.",
             "user": user if i % 2 else "zed"} for i in range(n)]


# ---- names are data, never paths ----------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["pshare-lora", "pshare-lora-federated"])
@pytest.mark.parametrize("user", ["x/../../../../victim", "../../../a", "a" * 300, "a\x00b", ".hidden", "-rf", "a b",
                                  "é"])
def test_a_user_that_is_not_a_name_is_one_line_before_a_model_loads(method, user, tmp_path, capsys, no_model):
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs_with_user(user))
    err = one_line(["train", method, "model=tiny-llama", "--data", str(data), "--out", str(tmp_path / "run")], capsys)
    assert f"{data}:2: field 'user': " in err and "is not a name" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]  # nothing made, the run folder neither


@pytest.mark.parametrize(("first", "second"), [(1, "1"), ("Ana", "ana")])
def test_two_spellings_of_one_name_are_refused_together(first, second, tmp_path, capsys, no_model):
    rows = pairs_with_user(first, 4) + pairs_with_user(second, 4)
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    err = one_line(["train", "pshare-lora", "--data", str(data), "--out", str(tmp_path / "run")], capsys)
    assert f"{data}:6: field 'user': {second!r} and {first!r} (line 2) would share one folder" in err


def test_an_adapter_name_that_leaves_the_run_folder_is_refused_before_anything_is_written(tmp_path):
    adapter = Adapter({}, {"r": 1})
    for name in ("user-../../victim", "../x", "a/b"):
        with pytest.raises(ValueError, match="is not a name"):
            Result("m", "reward", "tiny-llama", {}, "", {}, {name: adapter}).save(tmp_path / "run")
    assert not (tmp_path / "run").exists() and not (tmp_path / "victim").exists()


# ---- one folder rule -------------------------------------------------------------------------------------------

def test_two_trains_into_one_folder(examples, tmp_path, capsys):
    """The first holds the folder for its whole run; the second is refused while it runs, a third once it is done;
    the first's result is whole and unchanged."""
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "collabalign.cli", "train", "pshare-lora", *TINY, "--data",
                              str(examples["pairs"]), "--out", str(out), "--no-progress"],
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / OWNER_FILE).exists():
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
        time.sleep(0.05)
    err = one_line(["train", "pshare-lora", *TINY, "--data", str(examples["pairs"]), "--out", str(out)], capsys)
    assert f"{out}: in use by process {first.pid}" in err
    assert first.wait(timeout=300) == 0
    saved = files(out)
    assert "manifest.json" in saved and {"adapters/user-ana/head.safetensors", "adapters/user-cai/head.safetensors"} \
        <= set(saved)
    err = one_line(["train", "fedavg-lora", "--data", str(examples["pairs"]), "--out", str(out)], capsys)
    assert "holds a trained run" in err and files(out) == saved


@pytest.mark.parametrize("place", ["below-a-file", "dangling-link", "under-proc", "a-file"])
def test_an_out_that_cannot_hold_a_run_is_one_line_before_a_model_loads(place, examples, tmp_path, capsys, no_model):
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "dangling-link").symlink_to(tmp_path / "nowhere")
    out, message = {"below-a-file": (tmp_path / "a-file" / "run", "cannot create or open the run folder (Not a dir"),
                    "dangling-link": (tmp_path / "dangling-link", "a link to nothing"),
                    "under-proc": (Path("/proc/collabalign-run"), "cannot create or open the run folder"),
                    "a-file": (tmp_path / "a-file", "a file, not a folder")}[place]
    err = one_line(["train", "pshare-lora", "--data", str(examples["pairs"]), "--out", str(out)], capsys)
    assert f"{out}: {message}" in err
    assert (tmp_path / "a-file").read_text() == "mine" and not (tmp_path / "nowhere").exists()


def test_a_failed_train_leaves_no_folder_behind(tmp_path, capsys):
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs_with_user("ben", 3))  # ben: one pair, too few
    err = one_line(["train", "pshare-lora", *TINY, "--data", str(data), "--out", str(tmp_path / "run")], capsys)
    assert "field 'user': too few pairs: user 'ben' has 1" in err and not (tmp_path / "run").exists()


def test_saved_files_are_as_readable_as_any_other(reward_run):
    modes = {p.name: p.stat().st_mode & 0o777 for p in reward_run.rglob("*") if p.is_file()}
    expected = 0o666 & ~_umask()
    assert {"adapter_model.safetensors", "head.safetensors", "adapter_config.json", "manifest.json"} <= set(modes)
    assert set(modes.values()) == {expected}, modes


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- data a model cannot learn from, or that would exhaust memory or time -----------------------------------------

@pytest.mark.parametrize(("labels", "message"), [
    ([0, 10**11], "a class must be in 0..999"), ([1, 10**30], "a class must be in 0..999"),
    ([-1, 0], "a class must be in 0..999"), ([2, 2], "every row has the label 2: nothing to learn"),
    ([0.5, 0.5], "every row has the label 0.5: nothing to learn")])
def test_labels_a_classifier_cannot_learn_are_one_line(labels, message, tmp_path, capsys, no_model):
    data = write_jsonl(tmp_path / "l.jsonl", [{"text": f"text {i}", "label": v} for i, v in enumerate(labels)])
    assert message in one_line(["train", "fslora", "--data", str(data), "--out", str(tmp_path / "run")], capsys)


def bomb_gzip(path: Path, chunk: bytes, total: int) -> Path:
    """A gzip file inflating to `total` bytes of `chunk` repeated (written in pieces: never all in memory)."""
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(total // len(chunk)):
            f.write(chunk)
    return path


@pytest.mark.parametrize("case", ["long-line", "endless-zeros", "inflates", "blank-flood"])
def test_a_file_past_the_reading_limits_is_one_line(case, tmp_path, capsys, monkeypatch, no_model):
    monkeypatch.setenv("COLLABALIGN_MAX_DATA_BYTES", str(4 << 20))
    row = json.dumps({"prompt": "q", "chosen": "a", "rejected": "b", "user": "ana"}).encode() + b"\n"
    data, message = {
        "long-line": (lambda: bomb_gzip(tmp_path / "d.gz", b"x" * 4096, 2 << 20), "line longer than 1,048,576 bytes"),
        "endless-zeros": (lambda: Path("/dev/zero"), "line longer than 1,048,576 bytes"),
        "inflates": (lambda: bomb_gzip(tmp_path / "d.gz", row, 5 << 20), "more than 4,194,304 bytes of data"),
        "blank-flood": (lambda: bomb_gzip(tmp_path / "d.gz", b"\n" * 4096, 1 << 20), "more than 100,000 blank lines"),
    }[case]
    data = data()
    assert message in one_line(["train", "pshare-lora", "--data", str(data), "--out", str(tmp_path / "run")], capsys)


@pytest.mark.parametrize("case", ["truncated", "inflates", "header-lies", "objects"])
def test_an_npz_that_is_damaged_or_too_big_is_one_line(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLLABALIGN_MAX_DATA_BYTES", str(1 << 20))
    path = tmp_path / "agents.npz"
    if case == "objects":
        np.savez(path, X_a=np.array([[{"a": 1}]], dtype=object), y_a=np.zeros(1))
    else:
        np.savez(path, X_a=np.zeros((4, 2)), y_a=np.zeros(4), X_b=np.ones((4, 2)), y_b=np.ones(4))
    if case == "truncated":
        path.write_bytes(path.read_bytes()[:300])
    elif case == "inflates":
        with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive, archive.open("X_c.npy", "w") as f:
            for _ in range(2 << 4):
                f.write(bytes(1 << 16))  # 2 MiB of zeros
    elif case == "header-lies":  # a header promising 10^12 floats over a few bytes
        header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000), }"
        header += b" " * (63 - len(header) % 64) + b"\n"
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr("X_c.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(8))
    message = {"truncated": "not a whole .npz", "inflates": "inflate to more than 1,048,576 bytes",
               "header-lies": "its header declares (1000000, 1000000)", "objects": "Python objects"}[case]
    assert message in one_line(["train", "affpcl", "--data", str(path), "--out", str(tmp_path / "run")], capsys)


# ---- settings that do not fit the model or the data ---------------------------------------------------------------

@pytest.mark.parametrize(("method", "settings", "message"), [
    ("firm", ["model=tiny-llama", "rewards=[nosuch]"], "model 'nosuch': not found"),
    ("firm", ["model=tiny-llama", "rewards=[length, brevity]", "preference=[1, 2, 3]"], "preference has 3 weights"),
    ("fedavg-lora", ["model=tiny-llama", "lora.targets=[nosuch]"], "lora.targets: 'nosuch' matches no linear layer"),
    ("fedavg-lora", ["model=tiny-llama", "lora.targets=['[']"], "lora.targets: '[' is neither a layer name nor a"),
    ("fedavg-lora", ["model=tiny-llama", "max_length=100000"], "max_length = 100000: tiny-llama reads at most"),
    ("meta-reward", ["model=tiny-llama", "held_out=nosuch"], "held_out = 'nosuch': not a domain in the data"),
    ("pshare-lora", ["model=tiny-llama", "lora.rank=1000000000"], "error: out of memory ("),
])
def test_settings_the_model_or_data_cannot_take_are_one_line(method, settings, message, examples, tmp_path, capsys):
    data = examples["prompts" if method == "firm" else "pairs"]
    err = one_line(["train", method, *settings, "--data", str(data), "--out", str(tmp_path / "run"), "--no-progress"],
                   capsys)
    assert message in err and not (tmp_path / "run").exists()


def test_a_prompt_longer_than_the_policy_takes_is_one_line_naming_the_file(tmp_path, capsys):
    data = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hello?"}, {"prompt": "word " * 400}])
    err = one_line(["train", "firm", "model=tiny-llama", "rewards=[brevity]", "--data", str(data), "--out",
                    str(tmp_path / "run")], capsys)
    assert f"{data}: field 'prompt': prompt 1 is" in err and "max_prompt_tokens" in err


# ---- score and generate on damaged runs, with arguments out of range ----------------------------------------------

DAMAGE = {  # damage -> what the one line says
    "adapter-folder-gone": (lambda run: _remove(run / "adapters" / "user-ana"), "user-ana: missing"),
    "safetensors-cut": (lambda run: _cut(run / "adapters" / "user-ana" / "adapter_model.safetensors"),
                        "adapter_model.safetensors: unreadable"),
    "config-not-json": (lambda run: (run / "adapters" / "user-ana" / "adapter_config.json").write_text("{oops"),
                        "adapter_config.json: unreadable"),
    "config-not-lora": (lambda run: (run / "adapters" / "user-ana" / "adapter_config.json").write_text("[]"),
                        "adapter_config.json: not a LoRA adapter config"),
    "config-rank": (lambda run: _edit_json(run / "adapters" / "user-ana" / "adapter_config.json", r=10**9),
                    "adapter_model.safetensors: its tensors do not match adapter_config.json"),
    "head-gone": (lambda run: (run / "adapters" / "user-ana" / "head.safetensors").unlink(),
                  "head.safetensors: missing or not a score head"),
    "head-cut": (lambda run: _cut(run / "adapters" / "user-ana" / "head.safetensors"), "head.safetensors: unreadable"),
    "manifest-cut": (lambda run: _cut(run / "manifest.json"), "manifest.json: unreadable"),
    "manifest-adapter-escapes": (lambda run: _edit_json(run / "manifest.json", adapters=["user-ana", "../../../etc"]),
                                 "manifest.json: adapter '../../../etc' is not a name"),
    "manifest-length": (lambda run: _edit_json(run / "manifest.json", max_length="long"), "manifest.json: damaged"),
}


def _remove(folder: Path) -> None:
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_score_on_a_damaged_run_is_one_line(damage, reward_run, examples, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    for name, content in files(reward_run).items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(content)
    spoil, message = DAMAGE[damage]
    spoil(run)
    which = ["--adapter", "../../../etc"] if damage == "manifest-adapter-escapes" else ["--user", "ana"]
    assert message in one_line(["score", str(run), "--file", str(examples["texts"]), *which], capsys)


@pytest.mark.parametrize("user", ["../../x", "nosuch", "a" * 500])
def test_score_for_a_user_the_run_lacks_is_one_line(user, reward_run, examples, capsys, no_model):
    err = one_line(["score", str(reward_run), "--file", str(examples["texts"]), "--user", user], capsys)
    assert "no adapter" in err and "saved: user-ana, user-ben, user-cai" in err


@pytest.mark.parametrize("args", [["--max-new-tokens", "0"], ["--max-new-tokens", "-5"],
                                  ["--max-new-tokens", "1000000000"], ["--temperature", "nan"],
                                  ["--temperature", "-1"], ["--temperature", "inf"], ["--seed", "-1"]])
def test_generate_arguments_out_of_range_are_one_line_before_a_model_loads(args, policy_run, capsys, no_model):
    err = one_line(["generate", str(policy_run), "--prompt", "Hi", *args], capsys)
    assert args[0] in err and "must be in" in err


def test_generate_with_a_prompt_over_the_policy_limit_or_on_a_reward_run_is_one_line(policy_run, reward_run, capsys):
    assert "prompt 0 is" in one_line(["generate", str(policy_run), "--prompt", "word " * 300], capsys)
    huge = one_line(["generate", str(policy_run), "--prompt", "word " * 20_000], capsys)
    assert "prompt 0 is 100,000 characters long" in huge  # refused before tokenising
    assert "holds no policy" in one_line(["generate", str(reward_run), "--prompt", "Hi"], capsys)


@pytest.mark.parametrize(("prompt", "message"), [(" ", "--prompt 2: empty"),
                                                 ("caf\udce9", "--prompt 2: not valid UTF-8")])
def test_a_blank_or_undecodable_prompt_is_one_line_before_a_model_loads(prompt, message, policy_run, capsys, no_model):
    # "caf\udce9": what Python makes of the bytes b"caf\xe9" (not UTF-8) given as an argument
    assert message in one_line(["generate", str(policy_run), "--prompt", "Hi", "--prompt", prompt], capsys)


# ---- deploy ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["quickstart/quick", "--nodes", "3"], "must be one of fedavg-lora"),
    (["deploy/fslora", "--nodes", "3", "--node-config", "0:rank=999"], "must be at most the global rank"),
    (["deploy/fslora", "--nodes", "3", "--node-config", "0:colour=red"], "fslora nodes declare rank"),
    (["deploy/fedavg-lora", "--nodes", "2", "--node-config", "0:rank=2"], "fedavg-lora nodes declare no settings"),
    (["deploy/fslora", "--nodes", "3", "--node-config", "7:rank=2"], "I a node 0..2"),
    (["deploy/fslora", "--nodes", "0"], "--nodes: '0': must be in 1..64"),
    (["deploy/fslora", "--nodes", "1000"], "--nodes: '1000': must be in 1..64"),
    (["nosuch.yaml", "--nodes", "2"], "no such config file"),
])
def test_deploy_arguments_are_checked_before_a_model_loads(args, message, tmp_path, capsys, no_model):
    assert message in one_line(["deploy", *args, "--out", str(tmp_path / "run")], capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("owner", ["train", "user"])
def test_deploy_never_writes_into_a_folder_it_did_not_make(owner, reward_run, tmp_path, capsys, no_model):
    out = tmp_path / "out"
    if owner == "train":
        out = reward_run
    else:
        (out / "deployment").mkdir(parents=True)
        (out / "deployment" / "notes.txt").write_text("mine")
    before = files(out)
    err = one_line(["deploy", "deploy/fedavg-lora", "--nodes", "2", "--out", str(out)], capsys)
    assert ("made by `train`" if owner == "train" else "not written by collabalign") in err and files(out) == before
