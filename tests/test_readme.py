"""Every code block of the README runs: the Python snippets and the first shell block as written, on the example
data, with the real models swapped for the tiny random Llama and every training cut short (`SHORTER`; the real
models run in each entry point's `real` smoke and in `collabalign demo`); the reproduction block's commands are
checked to name shipped experiments and configs (running them is the experiments' own tests' job). The `make` lines
are what CI itself runs."""

import re
import shlex
from pathlib import Path

import pytest

from collabalign.cli import main
from collabalign.commands import config_dir, resolve_config
from collabalign.examples import write_examples
from collabalign.experiments import EXPERIMENTS

README = (Path(__file__).parents[1] / "README.md").read_text()
REAL = ("minilm-l6", "smollm2-135m")
# Each snippet's training cut to a round, an epoch or a few steps (the entry points' own tests train for real), with a
# given lr for P-ShareLoRA and FSLoRA: no lr: auto fits (lr: auto is the entry points' own tests' too)
SHORTER = {"clients=3, rounds=2)": "clients=3, rounds=1, local_steps=1, max_response_tokens=16)",  # federated DPO
           "epochs=6)": "epochs=1, lr=3e-3)", "rounds=8)": "rounds=2, lr=1e-3)",  # P-ShareLoRA, FSLoRA
           "rounds=2, clients=2": "rounds=1, clients=2",  # FIRM
           "outer_steps=10)": "outer_steps=2, sft_steps=2, test_steps=2)",  # the meta-learned reward
           "steps=2000)": "steps=200)", "rounds=3)": "rounds=1)"}  # AffPCL, FedAvg-LoRA
CLI_SHORTER = {"epochs=6": "epochs=1"}  # whole arguments of the CLI block (its P-ShareLoRA line keeps lr: auto)


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", README, re.S)


def tiny(text: str) -> str:
    for name in REAL:
        text = text.replace(f'"{name}"', '"tiny-llama"').replace(f"model={name}", "model=tiny-llama")
    for long, short in SHORTER.items():
        text = text.replace(long, short)
    return CLI_SHORTER.get(text, text)


@pytest.fixture
def examples(tmp_path, monkeypatch):
    write_examples(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_python_snippets_run_on_the_example_data(examples, capsys):
    snippets = blocks("python")
    assert len(snippets) >= 6
    for snippet in snippets:
        exec(compile(tiny(snippet), "README.md", "exec"), {})
    assert (examples / "runs" / "pshare" / "adapters" / "user-ana" / "adapter_config.json").exists()
    assert (examples / "runs" / "firm" / "adapters" / "policy" / "adapter_model.safetensors").exists()


def test_cli_block_runs_on_the_example_data(examples, capsys):
    for line in blocks("bash")[0].splitlines():
        args = shlex.split(line, comments=True)[1:]
        if args[0] == "train" and not any(a.startswith("model=") for a in args):
            args.insert(2, "model=tiny-llama")
        assert main([tiny(a) for a in args] + (["--no-progress"] if args[0] == "train" else [])) == 0, line
    out = capsys.readouterr().out
    assert '"score"' in out and (examples / "runs" / "firm-cli" / "manifest.json").exists()


def test_reproduction_block_names_shipped_experiments_and_configs(capsys):
    for line in blocks("bash")[1].splitlines():
        args = shlex.split(line, comments=True)[1:]
        if args[0] == "list":
            assert main(args) == 0
        elif args[0] == "reproduce":
            assert args[1] in EXPERIMENTS and config_dir(args[1]).is_dir()
        elif args[0] == "run":
            assert resolve_config(Path(args[1])).exists()
        else:
            assert args[0] == "report"


def test_deployment_block_names_shipped_deployment_configs():
    from collabalign.jobs import read_spec

    for line in blocks("bash")[2].splitlines():
        args = shlex.split(line, comments=True)[1:]
        assert args[0] == "deploy" and "--nodes" in args and "--out" in args
        assert read_spec(resolve_config(Path(args[1]))).method == args[1].split("/")[1]
