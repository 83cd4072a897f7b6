"""`collabalign train METHOD ... --data FILE --out DIR` for every method, on the example data with the tiny Llama;
bad input is one line and exit code 2."""

import json

import pytest

from collabalign.cli import main
from collabalign.examples import write_examples
from collabalign.registry import METHODS

TINY = {
    "fedavg-lora": ["model=tiny-llama", "rounds=1", "max_length=32"],
    "pshare-lora": ["model=tiny-llama", "epochs=1"],
    "meta-reward": ["model=tiny-llama", "policy=tiny-llama", "held_out=garden", "sft_steps=1", "outer_steps=2",
                    "select_every=1", "test_steps=1", "inner_steps=1", "max_length=32"],
    "firm": ["model=tiny-llama", "rounds=1", "clients=2", "batch_size=2", "max_new_tokens=2", "rewards=[brevity]"],
    "fslora": ["model=tiny-llama", "rounds=1", "ranks=[2,4]"],
    "affpcl": ["steps=50"],
    "pshare-lora-federated": ["model=tiny-llama", "rounds=1", "lora.blocks=1", "max_length=32"],
    "affpcl-federated": ["steps=20"],
    "fed-tune": ["model=tiny-llama", "objective=dpo", "rounds=1", "local_steps=2", "max_response_tokens=8"],
}


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    return write_examples(tmp_path_factory.mktemp("examples"))


@pytest.mark.parametrize("method", list(METHODS))
def test_train_saves_a_run(method, examples, tmp_path):
    out = tmp_path / "run"
    assert main(["train", method, *TINY[method], "--data", str(examples[METHODS[method].data]), "--out", str(out),
                 "--no-progress"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["method"] in (method, "fslora", "fed-dpo") and manifest["data_hash"]


@pytest.mark.parametrize(("args", "message"), [
    (["nosuch"], "unknown method 'nosuch'"),
    (["pshare-lora", "lora.rank=0"], "lora.rank = 0"),
    (["pshare-lora", "epochs=1", "model=tiny-llama", "--data", "missing.jsonl"], "missing.jsonl: no such file"),
    (["firm", "model=tiny-llama", "--data", "LABELLED"], "field 'prompt': missing field"),
])
def test_bad_input_is_one_line(args, message, examples, tmp_path, capsys):
    args = [a.replace("LABELLED", str(examples["labelled"])) for a in args]
    if "--data" not in args:
        args += ["--data", str(examples["pairs"])]
    assert main(["train", *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
