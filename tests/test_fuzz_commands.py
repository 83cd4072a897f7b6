"""Property-based fuzz of `train`, `score`, `generate` and `deploy`, in process: random user names in a data file,
random arguments, damaged run folders and random `--out` places give exit code 0 or 2 (one short stderr line), never
a traceback; nothing is written outside the command's own folder, and no folder a command did not make changes.
Training, generation and the deployment itself are stubbed where the check is about the surface around them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collabalign.deployment
import collabalign.methods.pshare_lora.entry as pshare_entry
from collabalign import cli, jobs
from collabalign.artifacts import Adapter, Result
from collabalign.data.formats import pairs_and_hash
from collabalign.examples import write_examples
from tests.test_fuzz import JSON, fuzz
from tests.test_fuzz_cli import snapshot

NASTY = ["..", ".", "a/b", "../x", "x/../../../victim", "a\x00b", "a" * 300, "-rf", ".hidden", "CON", "nul", "é",
         " ana", "ana ", "user-ana", "1", "01", "Ana"]
NAMES = st.one_of(st.sampled_from(NASTY), st.text(max_size=12), st.integers(-5, 10**20))


def cases(examples: int) -> settings:
    return settings(fuzz(examples), suppress_health_check=[*fuzz(examples).suppress_health_check,
                                                           HealthCheck.function_scoped_fixture])


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The CLI's exit code and stderr; asserts 0 or 2, and one short line with 2."""
    try:
        code = cli.main(args)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code in (0, 2), (args, captured.err[-3000:])
    if code == 2:
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1 and len(captured.err) < 1100, \
            captured.err[:300]
    return code, captured.out


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> Path:
    """A sandbox: the example data, a file, a folder of someone's files, and a trained reward run."""
    root = tmp_path_factory.mktemp("fuzz-commands")
    write_examples(root / "data")
    (root / "a-file").write_text("mine")
    (root / "foreign").mkdir()
    (root / "foreign" / "notes.txt").write_text("mine")
    assert cli.main(["train", "pshare-lora", "model=tiny-llama", "epochs=1", "--data", str(root / "data" /
                                                                                         "pairs.jsonl"),
                     "--out", str(root / "trained"), "--no-progress"]) == 0
    return root


def stub_training(config, data, model=None, progress=False) -> Result:
    """P-ShareLoRA's entry point without the training: the real loader, one small adapter per user."""
    pairs, data_hash = pairs_and_hash(data, require=("user",))
    adapter = Adapter({"base_model.model.q.lora_A.weight": torch.zeros(1, 2),
                       "base_model.model.q.lora_B.weight": torch.zeros(2, 1)},
                      {"r": 1, "lora_alpha": 1, "target_modules": ["q"]}, {"weight": torch.zeros(1, 2),
                                                                           "bias": torch.zeros(1)})
    return Result("pshare-lora", "reward", "tiny-llama", {}, data_hash, {},
                  {f"user-{p.party}": adapter for p in pairs})


@cases(100)
@given(users=st.lists(NAMES, min_size=1, max_size=3), out=st.sampled_from(["new", "a-file", "foreign", "trained"]))
def test_random_user_names_never_reach_outside_the_run_folder(place, capsys, monkeypatch, users, out):
    monkeypatch.setattr(pshare_entry, "train_pshare_lora", stub_training)
    data = place / "users.jsonl"
    data.write_text("".join(json.dumps({"prompt": "q", "chosen": "yes", "rejected": "no", "user": u}) + "\n"
                            for u in users))
    target = place / f"new-{len(list(place.iterdir()))}" if out == "new" else place / out
    before = snapshot(place)
    code, _ = run_cli(["train", "pshare-lora", "--data", str(data), "--out", str(target)], capsys)
    after = snapshot(place)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= {"users.jsonl"} | ({k for k in after if k.startswith(f"{target.name}/") or k == target.name}
                                         if code == 0 else set())
    if code == 0:
        assert out == "new" and {p.parent.parent for p in target.glob("adapters/*/adapter_config.json")} == \
            {target / "adapters"}


DAMAGES = st.sampled_from(["none", "cut", "bytes", "json", "remove"])
FILES = st.sampled_from(["manifest.json", "adapters/user-ana/adapter_config.json",
                         "adapters/user-ana/adapter_model.safetensors", "adapters/user-ana/head.safetensors",
                         "adapters/user-ana", "adapters"])


@cases(30)
@given(damage=DAMAGES, file=FILES, data=st.data(), who=st.sampled_from(["--user", "--adapter", "none"]))
def test_random_score_arguments_and_damaged_runs_give_exit_0_or_one_line(place, capsys, tmp_path_factory, damage,
                                                                          file, data, who):
    run = tmp_path_factory.mktemp("score") / "run"
    shutil.copytree(place / "trained", run)
    path = run / file
    if damage == "remove":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    elif damage != "none" and path.is_file():
        whole = path.read_bytes()
        path.write_bytes({"cut": lambda: whole[: data.draw(st.integers(0, len(whole) - 1))],
                          "bytes": lambda: data.draw(st.binary(max_size=64)),
                          "json": lambda: json.dumps(data.draw(JSON)).encode()}[damage]())
    texts = run.parent / "texts.jsonl"
    rows = data.draw(st.lists(st.one_of(JSON, st.fixed_dictionaries({"text": st.text(max_size=20)})), max_size=3))
    texts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["score", str(run), "--file", str(texts)]
    if who != "none":
        args += [who, data.draw(NAMES.map(str))]
    before = snapshot(place)
    run_cli(args, capsys)
    assert snapshot(place) == before


NUMBERS = st.one_of(st.integers(-10, 10**12).map(str), st.floats().map(str), st.sampled_from(["", "x", "1e3", "0x10"]))


@cases(100)
@given(tokens=NUMBERS, temperature=NUMBERS, seed=NUMBERS)
def test_random_generate_arguments_are_refused_in_one_line_or_in_range(place, capsys, monkeypatch, tokens,
                                                                       temperature, seed):
    calls = []
    monkeypatch.setattr(cli, "generate", lambda *args: calls.append(args))
    code, _ = run_cli(["generate", str(place / "trained"), "--prompt", "Hi", "--max-new-tokens", tokens,
                       "--temperature", temperature, "--seed", seed], capsys)
    if code == 0:
        _, _, _, max_new, temp, seed_ = calls[0]
        assert 1 <= max_new <= cli.MAX_NEW_TOKENS and 0 <= temp <= 100 and seed_ >= 0


NODE_ITEMS = st.one_of(st.text(max_size=12), st.builds(lambda i, k, v: f"{i}:{k}={v}", st.integers(-2, 4),
                                                       st.sampled_from(["rank", "colour", "", "partition-id"]),
                                                       st.sampled_from(["2", "4", "999", "-1", "x", "[1]", ""])))


@cases(100)
@given(config=st.sampled_from(["deploy/fslora", "deploy/fedavg-lora", "quickstart/quick", "a-file", "nosuch.yaml"]),
       nodes=st.one_of(st.integers(-2, 5).map(str), st.sampled_from(["1000", "x", ""])),
       items=st.lists(NODE_ITEMS, max_size=3), out=st.sampled_from(["new", "a-file", "foreign", "trained"]))
def test_random_deploy_arguments_and_folders_give_exit_0_or_one_line(place, capsys, monkeypatch, config, nodes,
                                                                     items, out):
    monkeypatch.setattr(jobs, "build", lambda spec: SimpleNamespace(clients={
        f"client{i}": None for i in range(len(getattr(spec.config, "ranks", [0, 0])))}))
    monkeypatch.setattr(collabalign.deployment, "_run", lambda spec, run_config, *args: Path(run_config["out"]))
    target = place / f"deploy-{len(list(place.iterdir()))}" if out == "new" else place / out
    config = str(place / config) if config == "a-file" else config
    before = snapshot(place)
    code, _ = run_cli(["deploy", config, "--nodes", nodes, *(f"--node-config={i}" for i in items), "--out",
                       str(target)], capsys)
    after = snapshot(place)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed or (code == 0 and out == "new" and all(k.startswith(target.name) for k in changed))
