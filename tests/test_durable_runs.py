"""Durable runs through the CLI: kill -9 mid-run, `collabalign resume`, byte-identical results; status files, the
report of a killed run, refusing a folder of another config, file modes."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collabalign.cli import main
from collabalign.commands import config_path

TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj, v_proj]", "data.synthetic_pairs=96",
        "data.max_length=24", "split.clients=4", "split.min_pairs=4", "train.local_only_eval_every=4"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()  # no HH-RLHF file: the quickstart's synthetic pairs
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path / "empty"))
    return {**os.environ, "COLLABALIGN_DATA": str(tmp_path / "empty"), "OMP_NUM_THREADS": "1"}


def cli(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "collabalign.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def outputs(run: Path) -> dict[str, bytes]:
    files = [run / "metrics.jsonl", *sorted((run / "adapters").rglob("*.safetensors"))]
    return {str(p.relative_to(run)): p.read_bytes() for p in files}


def test_kill_9_then_resume_ends_byte_identical_to_an_uninterrupted_run(tmp_path, env):
    quick = str(config_path("quickstart", quick=True))
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = cli("run", quick, *TINY, "train.rounds=8", "--out", str(killed), "--no-progress", env=env)
    deadline = time.monotonic() + 300
    while not list((killed / "checkpoints").glob("0002-*/state-0000[2-9].safetensors")):  # mid local-only
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads((killed / "status.json").read_text())["status"] == "running"
    assert not (killed / "summary.json").exists()
    assert main(["report", str(killed)]) == 0  # a killed run still gets a report
    report = (killed / "report.md").read_text()
    assert "**Status: running**" in report and "0001-fedavg-lora_seed_0: round 8" in report
    assert main(["resume", str(killed), "--no-progress"]) == 0
    assert json.loads((killed / "status.json").read_text())["status"] == "finished"
    assert main(["run", quick, *TINY, "train.rounds=8", "--out", str(whole), "--no-progress"]) == 0  # as resumed
    got, expected = outputs(killed), outputs(whole)
    assert set(got) == {"metrics.jsonl", *(f"adapters/{m}-seed0/{f}.safetensors" for m in ("centralised", "fedavg-lora")
                                            for f in ("adapter_model", "head"))}
    assert got == expected


def test_a_folder_of_another_config_is_refused_unless_forced_and_files_are_world_readable(tmp_path, env, capsys):
    quick = str(config_path("quickstart", quick=True))
    out = tmp_path / "run"
    assert main(["run", quick, *TINY, "train.rounds=1", "--out", str(out), "--no-progress"]) == 0
    assert main(["run", quick, *TINY, "train.rounds=2", "--out", str(out), "--no-progress"]) == 2
    assert "holds a run of another config; choose another folder, or --force" in capsys.readouterr().err
    assert main(["run", quick, *TINY, "train.rounds=2", "--out", str(out), "--no-progress", "--force"]) == 0
    for path in (out / "config.yaml", out / "metrics.jsonl", out / "summary.json", out / "status.json"):
        assert stat.S_IMODE(path.stat().st_mode) & 0o044 == 0o044, path
    assert main(["report", str(tmp_path)]) == 0  # a folder of runs: each report and an index
    assert "| [run](run/report.md) |" in (tmp_path / "report.md").read_text()


def test_a_failed_run_records_the_error(tmp_path, env, monkeypatch):
    from collabalign.experiments.quickstart import comparison

    def broken(*_args, **_kw):
        raise RuntimeError("a bug in the method")

    monkeypatch.setattr(comparison, "simulate", broken)
    with pytest.raises(RuntimeError):
        main(["run", str(config_path("quickstart", quick=True)), *TINY, "--out", str(tmp_path / "r"), "--no-progress"])
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["status"] == "failed" and status["error"] == "RuntimeError: a bug in the method"


def test_cached_json_recomputes_only_when_the_fingerprint_changes(tmp_path):
    from collabalign.runs import cached_json, fingerprint, read_cached

    calls = []

    def compute():
        calls.append(1)
        return {"value": len(calls)}

    path = tmp_path / "cells" / "a.json"
    key = fingerprint({"lr": 0.1, "seed": 0})
    assert key == fingerprint({"seed": 0, "lr": 0.1}) != fingerprint({"seed": 1, "lr": 0.1})
    assert cached_json(path, key, compute) == {"value": 1}
    assert cached_json(path, key, compute)["value"] == 1 and len(calls) == 1  # read back, not recomputed
    other = fingerprint({"lr": 0.2, "seed": 0})
    assert read_cached(path, key) == {"value": 1} and read_cached(path, other) is None  # what a rerun would find
    assert cached_json(path, other, compute) == {"value": 2}
    assert json.loads(path.read_text())["fingerprint"] == other
    assert read_cached(path, key) is None and read_cached(tmp_path / "cells" / "b.json", other) is None
