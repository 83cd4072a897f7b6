"""Issue 35's bad inputs: each is one line on stderr and exit code 2, and a refused command leaves the run folder as
it was; a run folder is used by one process at a time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collabalign.cli import main
from collabalign.config import MAX_CONFIG_BYTES, MAX_OVERRIDE_CHARS
from collabalign.folders import locked_folder

TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj,v_proj]", "data.source=synthetic",
        "data.synthetic_pairs=96", "data.max_length=24", "split.clients=4", "split.min_pairs=4", "train.rounds=2"]
STATE = "checkpoints/0001-fedavg-lora_seed_0"


def one_line_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the CLI in process; asserts exit code 2 and one short stderr line; returns it."""
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1 and len(err) < 1100, err[:300]
    return err


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below `folder` with its bytes (folders as empty entries)."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


def run_args(out: Path, *overrides: str) -> list[str]:
    return ["run", "quickstart/quick", *TINY, *overrides, "--out", str(out), "--no-progress"]


def write_config(path: Path, body: str) -> Path:
    path.write_text(f"experiment: quickstart\nsmoke: true\n{body}")
    return path


# ---- configs and overrides -----------------------------------------------------------------------------------

def test_yaml_aliases_are_refused_in_config_files_and_overrides(tmp_path, capsys):
    levels = [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    bomb = write_config(tmp_path / "bomb.yaml", "a0: &a0 [x,x,x,x,x,x,x,x,x]\n" + "\n".join(levels) + "\nseeds: *a9\n")
    assert "line 4: aliases (*name) are not allowed" in one_line_error(["run", str(bomb)], capsys)
    assert "aliases (*name) are not allowed" in one_line_error(["run", "quickstart/quick", "seeds=[&a 0, *a]"],
                                                               capsys)
    assert not Path("runs/quickstart-bomb").exists()


def test_a_too_large_config_or_override_is_refused_by_size(tmp_path, capsys):
    big = write_config(tmp_path / "big.yaml", f"bogus: '{'x' * MAX_CONFIG_BYTES}'\n")
    assert f"bytes; a config file may have at most {MAX_CONFIG_BYTES:,}" in one_line_error(["run", str(big)], capsys)
    assert "a config file may have at most" in one_line_error(["run", "/dev/zero"], capsys)  # an endless file
    err = one_line_error(["run", "quickstart/quick", "bogus=" + "y" * MAX_OVERRIDE_CHARS], capsys)
    assert f"an override may have at most {MAX_OVERRIDE_CHARS:,}" in err


def test_a_huge_value_is_cut_in_the_error_line(tmp_path, capsys):
    err = one_line_error(["run", "quickstart/quick", "bogus=" + "y" * 5000, "deep=" + "[" * 50 + "]" * 50], capsys)
    assert "bogus = 'yyyy" in err and "..." in err and "deep = [[[" in err


def test_the_duplicate_check_of_100_000_seeds_is_linear(tmp_path, capsys):
    seeds = write_config(tmp_path / "seeds.yaml", f"seeds: {list(range(100_000)) + [7, 9]}\n")
    start = time.perf_counter()
    err = one_line_error(["run", str(seeds)], capsys)
    assert "repeated value(s) [7, 9]: each may appear once" in err and time.perf_counter() - start < 20


# ---- the run folder ------------------------------------------------------------------------------------------

def test_an_out_that_is_a_file_or_below_one_is_one_line_and_untouched(tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("mine")
    assert "a file, not a folder" in one_line_error(run_args(file), capsys)
    assert "cannot create or open the run folder (Not a directory)" in one_line_error(run_args(file / "run"), capsys)
    assert file.read_text() == "mine"


def test_an_unwritable_out_or_run_folder_is_one_line(tmp_path, capsys, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("collabalign.folders.tempfile.TemporaryFile", refuse)  # root may write anywhere: stand in
    out = tmp_path / "run"
    assert "the run folder is not writable (Permission denied)" in one_line_error(run_args(out), capsys)
    assert snapshot(out) == {}


def test_a_second_run_or_resume_is_refused_while_the_first_holds_the_folder(tmp_path, capsys, finished_run):
    before = snapshot(finished_run)
    with locked_folder(finished_run):
        assert f"in use by process {os.getpid()}" in one_line_error(run_args(finished_run), capsys)
        assert "in use by" in one_line_error(["resume", str(finished_run)], capsys)
    assert snapshot(finished_run) == before


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    code = ("import time; from pathlib import Path; from collabalign.folders import locked_folder\n"
            f"with locked_folder(Path({str(out)!r})):\n    print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    assert f"in use by process {holder.pid}" in one_line_error(run_args(out), capsys)
    holder.kill()
    holder.wait()
    with locked_folder(out):  # what `run` takes first; the run itself is tested below
        pass


def test_two_runs_into_one_folder_at_once_one_is_refused_and_the_other_is_whole(tmp_path, capsys):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "collabalign.cli", *run_args(out, "train.rounds=4")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    while not (out / "status.json").exists() and first.poll() is None:
        time.sleep(0.05)
    assert "in use by process" in one_line_error(run_args(out, "train.rounds=4"), capsys)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    rounds = [json.loads(line)["round"] for line in (out / STATE / "rounds.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3, 4]
    assert json.loads((out / "status.json").read_text())["status"] == "finished"


# ---- data, model, device -------------------------------------------------------------------------------------

def test_too_small_data_or_too_many_clients_is_a_data_error_naming_the_sizes(tmp_path, capsys):
    rows = [{"prompt": f"p{i}", "chosen": f"good {i}", "rejected": f"bad {i}", "user": i % 2} for i in range(3)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = one_line_error(run_args(tmp_path / "a", "data.source=jsonl", f"data.path={data}", "split.attribute=user"),
                         capsys)
    assert "split: cannot give 4 clients 4 items each from only 2 items" in err
    err = one_line_error(run_args(tmp_path / "b", "split.clients=1000"), capsys)
    assert "split: cannot give 1000 clients 4 items each from only 72 items" in err
    err = one_line_error(run_args(tmp_path / "c", "split.min_pairs=18", "split.alpha=0.001"), capsys)
    assert "no Dirichlet(alpha=0.001) draw in 1000 tries gave all 4 clients >= 18 of the 72 items" in err


def test_an_unknown_model_is_a_config_error_naming_it_and_where_models_come_from(tmp_path, capsys):
    err = one_line_error(run_args(tmp_path / "run", "model.backbone=no-such-model"), capsys)
    assert "model 'no-such-model': not found; a model is one of tiny-llama, smollm2-135m, minilm-l6" in err


@pytest.mark.parametrize("device, message", [("cuda:99", "this machine has"), ("banana", "not a torch device")])
def test_an_unavailable_or_unknown_device_is_one_line_before_any_work(device, message, tmp_path, capsys):
    err = one_line_error(run_args(tmp_path / "run", f"model.device={device}"), capsys)
    assert f"model.device = '{device}': {message}" in err and not (tmp_path / "run").exists()


# ---- garbage or truncated run files --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(run_args(out)) == 0
    return out


def killed_copy(finished: Path, target: Path) -> Path:
    """A copy of a finished run whose status says it was still running (as after `kill -9`)."""
    shutil.copytree(finished, target)
    status = json.loads((target / "status.json").read_text())
    (target / "status.json").write_text(json.dumps({**status, "status": "running"}))
    return target


def spoil(path: Path, how: str) -> None:
    if how == "garbage":
        path.write_bytes(b"\x00\xff{garbage: [")
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("how", ["garbage", "truncated"])
@pytest.mark.parametrize("name", ["config.yaml", "status.json", f"{STATE}/state.json",
                                  f"{STATE}/state-00002.safetensors"])
def test_a_garbage_or_truncated_run_file_is_one_line_and_leaves_the_status(name, how, finished_run, tmp_path, capsys):
    run = killed_copy(finished_run, tmp_path / "run")
    spoil(run / name, how)
    status = (run / "status.json").read_bytes()
    err = one_line_error(["resume", str(run), "--no-progress"], capsys)
    assert str(run) in err
    assert (run / "status.json").read_bytes() == status
    if name in ("config.yaml", "status.json"):
        assert "restore or delete it" in one_line_error(["report", str(run)], capsys)
        assert (run / "status.json").read_bytes() == status


def test_a_usage_error_is_one_line_with_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "quickstart/quick", "-x=a\nb"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == "error: unrecognized arguments: -x=a b (see `collabalign --help`)\n"
