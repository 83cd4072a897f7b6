"""Deployment configs (jobs.py): every shipped one reads, a bad one is one line naming the file and key, and
`collabalign deploy` refuses a node count that does not match the job's clients before starting any process."""

import tomllib
from pathlib import Path

import pytest

from collabalign import jobs
from collabalign.cli import main
from collabalign.commands import CONFIG_DIR
from collabalign.config import ConfigError
from collabalign.deployment import write_app
from collabalign.registry import FEDERATED

SHIPPED = sorted((CONFIG_DIR / "deploy").glob("*.yaml"))


def test_every_shipped_deployment_config_reads_with_its_example_data():
    assert {p.stem for p in SHIPPED} == set(FEDERATED)
    for path in SHIPPED:
        spec = jobs.read_spec(path)
        assert spec.method == path.stem and spec.data.is_file()


def test_a_methods_own_method_key_chooses_its_variant():
    spec = jobs.read_spec(CONFIG_DIR / "deploy" / "fslora.yaml", ["method=heterolora"])
    assert spec.method == "fslora" and spec.config.method == "heterolora"


@pytest.mark.parametrize(("text", "problem"), [
    ("train: sgd\ndata: example\n", "train = 'sgd': must be one of"),
    ("train: fslora\n", "data = None"),
    ("train: fslora\ndata: nowhere.jsonl\n", "no such file"),
    ("train: fslora\ndata: example\nrounds: 0\n", "rounds"),
    ("train: fslora\ndata: example\nrank: 4\n", "rank"),
])
def test_a_bad_deployment_config_is_one_clear_error(tmp_path, text, problem):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises((ConfigError, ValueError), match=problem):
        jobs.read_spec(path)


def test_relative_data_is_read_from_the_config_folder(tmp_path):
    (tmp_path / "mine.jsonl").write_text(jobs.example_file("labelled").read_text())
    (tmp_path / "job.yaml").write_text("train: fslora\ndata: mine.jsonl\nlr: 0.001\n")
    assert jobs.read_spec(tmp_path / "job.yaml").data == (tmp_path / "mine.jsonl").resolve()


def test_deploy_refuses_a_node_count_that_does_not_match_the_clients(tmp_path, capsys):
    code = main(["deploy", "deploy/fslora", "model=tiny-llama", "ranks=[2, 4]", "lora.rank=4", "--nodes", "3",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "--nodes 3: the job of" in err and "has 2 clients" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_what_a_node_declares_sets_its_clients_setting():
    spec = jobs.read_spec(CONFIG_DIR / "deploy" / "fslora.yaml", ["ranks=[2, 4]", "lora.rank=8"])
    adapted = jobs.with_node_settings(spec, ["device0", "device1"], {"device0": {"rank": 8}, "device1": {"zone": 3}})
    assert adapted.config.ranks == [8, 4] and spec.config.ranks == [2, 4]
    assert jobs.with_node_settings(spec, ["device0", "device1"], {"device1": {"zone": 3}}) is spec  # not fslora's
    with pytest.raises(ConfigError, match="node config"):
        jobs.with_node_settings(spec, ["device0", "device1"], {"device0": {"rank": 16}})  # above lora.rank
    fedavg = jobs.read_spec(CONFIG_DIR / "deploy" / "fedavg-lora.yaml")
    assert jobs.with_node_settings(fedavg, ["client0"], {"client0": {"rank": 4}}) is fedavg


@pytest.mark.parametrize("item", ["5:rank=2", "rank=2", "0:rank", "x:rank=2"])
def test_a_bad_node_config_option_is_one_line(item, tmp_path, capsys):
    code = main(["deploy", "deploy/fslora", "--nodes", "2", "--node-config", item, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and f"--node-config {item}: must be I:KEY=VALUE" in err and err.count("\n") == 1


def test_deploy_refuses_a_folder_that_is_not_a_deployments(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "thesis.tex").write_text("mine")
    code = main(["deploy", "deploy/fslora", "model=tiny-llama", "ranks=[2, 4]", "lora.rank=4", "--nodes", "2",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "holds files not written by collabalign (thesis.tex)" in err and err.count("\n") == 1


def test_the_written_app_folder_and_the_projects_flower_app_name_the_same_apps_and_run_config(tmp_path):
    """`collabalign deploy` (and the deployment tests) run `flwr run` on the folder `write_app` writes; `flwr run .` in
    a checkout packs the project's own pyproject.toml: both must start the same ServerApp and ClientApp."""
    written = tomllib.loads((write_app(tmp_path) / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert written["components"] == project["components"] == {"serverapp": "collabalign.app:server_app",
                                                               "clientapp": "collabalign.app:client_app"}
    assert written["config"].keys() == project["config"].keys() == {"config", "overrides", "out"}
    assert written["publisher"] == project["publisher"]
