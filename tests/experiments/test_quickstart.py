"""The quickstart end to end through the CLI: synthetic fallback with a tiny model (fast), real data (marked)."""

import contextlib
import io
import json
import shutil

import pytest

from collabalign.cli import main
from collabalign.commands import config_path

TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj, v_proj]", "data.synthetic_pairs=96",
        "data.max_length=24", "split.clients=4", "split.min_pairs=4", "train.rounds=2",
        "train.local_only_eval_every=2", "--no-progress"]


def run_cli(args, capsys):
    rc = main(args)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture
def no_shared_data(monkeypatch, tmp_path):
    (tmp_path / "empty").mkdir()  # a data folder without the HH-RLHF file
    monkeypatch.setenv("COLLABALIGN_DATA", str(tmp_path / "empty"))


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """Two runs of the same config and seed, made once for the file's tests (they only read them)."""
    root = tmp_path_factory.mktemp("quickstart-tiny")
    (root / "empty").mkdir()  # as `no_shared_data`: a data folder without the HH-RLHF file
    outs = [root / "a", root / "b"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("COLLABALIGN_DATA", str(root / "empty"))
        for out in outs:
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                rc = main(["run", str(config_path("quickstart", quick=True)), *TINY, "--out", str(out)])
            err = stderr.getvalue()
            assert rc == 0, err
            assert stdout.getvalue().strip() == str(out / "report.md")
            assert "running on synthetic pairs" in err
    return outs


def test_same_config_and_seed_give_byte_identical_metrics(tiny_runs):
    a, b = tiny_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "ledger.csv").read_bytes() == (b / "ledger.csv").read_bytes()


def test_run_directory_holds_config_metrics_ledger_claims_and_report(tiny_runs):
    run = tiny_runs[0]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = {m: [r["round"] for r in records if r["method"] == m] for m in ("fedavg-lora", "local-only",
                                                                           "centralised")}
    assert rounds == {"fedavg-lora": [0, 1, 2], "local-only": [0, 2], "centralised": [0, 1, 2]}
    summary = json.loads((run / "summary.json").read_text())
    assert [c["name"] for c in summary["claims"]] == ["FedAvg-LoRA beats local-only",
                                                      "FedAvg-LoRA is within 3 points of centralised"]
    assert {c["verdict"] for c in summary["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
    beats, near = summary["claims"]
    assert (beats["rule"], beats["margin"]) == ("superiority", 0.0)
    assert (near["rule"], near["margin"]) == ("non-inferiority", 3.0)
    assert beats["n"] == 1 and beats["interval"] is None and beats["post_hoc"] is False  # one seed: no interval
    assert summary["metrics"]["data"]["source"] == "synthetic:tiny_preferences"
    assert any("Fallback" in n for n in summary["notes"])
    header, *rows = (run / "ledger.csv").read_text().splitlines()
    assert header == "method,round,client,direction,bytes"
    assert {r.split(",")[0] for r in rows} == {"fedavg-lora", "local-only"}
    report = (run / "report.md").read_text()
    assert "| FedAvg-LoRA beats local-only |" in report and "**Fallback:**" in report
    assert report.splitlines()[2].startswith("**Smoke run.**")  # a quick config opens with the smoke-run line
    for plot in ("accuracy_per_round", "loss_per_round", "bytes_per_round"):
        assert (run / "plots" / f"{plot}.png").stat().st_size > 1000
        assert f"(plots/{plot}.png)" in report
    config = (run / "config.yaml").read_text()
    assert "backbone: tiny-llama" in config and "torch:" in config


def test_report_command_rewrites_the_report(tiny_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(tiny_runs[0], run)  # a copy: the shared runs stay as the run wrote them
    (run / "report.md").unlink()
    rc, out, _ = run_cli(["report", str(run)], capsys)
    assert rc == 0 and (run / "report.md").read_text().startswith("# Quickstart: FedAvg-LoRA")  # the title again


@pytest.mark.parametrize("args, message", [
    (["run", "CONFIG", "train.rouds=3"], "train.rouds = 3"),
    (["run", "CONFIG", "train.rounds=many"], "train.rounds = 'many'"),
    (["run", "CONFIG", "train"], "must look like key.path=value"),
    (["reproduce", "nonsense"], "unknown experiment 'nonsense'"),
    (["report", "NOT_A_RUN"], "not a run directory"),
])
def test_cli_errors_name_the_bad_input(args, message, capsys, tmp_path):
    args = [str(config_path("quickstart", True)) if a == "CONFIG" else str(tmp_path) if a == "NOT_A_RUN" else a
            for a in args]
    rc, _, err = run_cli(args, capsys)
    assert rc == 2 and message in err


def test_list_names_each_experiment_and_its_configs(capsys):
    rc, out, _ = run_cli(["list"], capsys)
    assert rc == 0 and "quickstart" in out and "quickstart/quick.yaml" in out and "quickstart/main.yaml" in out


@pytest.mark.real
def test_quickstart_on_real_hh_rlhf_pairs(tmp_path, capsys):
    overrides = ["data.max_pairs=160", "train.rounds=1", "split.min_pairs=4", "train.local_only_eval_every=1",
                 "data.max_length=16"]  # short texts: what is checked is the data the real file gives
    rc, _, err = run_cli(["run", str(config_path("quickstart", True)), *overrides, "--out", str(tmp_path),
                          "--no-progress"], capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"]["data"]["source"].endswith("harmless-base-test.jsonl.gz")
    assert summary["metrics"]["data"]["dropped"] == {"chosen: empty text": 4,
                                                     "rejected: prompt differs from chosen's": 5}
    assert sum(summary["metrics"]["data"]["per_seed"][0]["client_pairs"]) == 120


def test_fedavg_lora_with_client_level_dp_reports_the_privacy_it_spent(no_shared_data, tmp_path, capsys):
    dp = ["aggregation.privacy.clip=1.0", "aggregation.privacy.noise_multiplier=1.0", "engine.min_replies=2"]
    rc, _, err = run_cli(["run", str(config_path("quickstart", quick=True)), *dp, *TINY, "--out",
                          str(tmp_path / "run")], capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    privacy = summary["metrics"]["privacy"]
    assert privacy["delta"] == 1e-5 and 0 < privacy["epsilon"] < float("inf")


def write_pairs(path, users=4, per_user=24, drop_user_on=None):
    """A preference-pairs JSONL: `per_user` polite-vs-rude pairs per user, each user its own domain."""
    rows = []
    for i in range(users * per_user):
        row = {"prompt": f"Question {i}: can you help?", "chosen": f"Gladly, here is answer {i}.",
               "rejected": f"No. Figure out {i} yourself.", "user": f"u{i % users}", "domain": f"d{i % users}"}
        if i == drop_user_on:
            del row["user"]
        rows.append(json.dumps(row))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("attribute", ["user", "domain"])
def test_a_jsonl_of_preference_pairs_is_split_by_its_users_or_domains(attribute, tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.jsonl")
    overrides = [*TINY[:-1], "data.source=jsonl", f"data.path={data}", f"split.attribute={attribute}", "--no-progress"]
    rc, _, err = run_cli(["run", str(config_path("quickstart", quick=True)), *overrides, "--out",
                          str(tmp_path / "run")], capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    info = summary["metrics"]["data"]
    assert (info["source"], info["pairs"], info["attribute"]) == (str(data), 96, attribute)
    assert sum(info["per_seed"][0]["client_pairs"]) == info["per_seed"][0]["train_pairs"] == 72
    assert any(f"96 preference pairs from {data}" in n for n in summary["notes"])
    assert "Fallback" not in " ".join(summary["notes"])


@pytest.mark.parametrize("overrides, message", [
    (["split.attribute=topic"], "split.attribute = 'topic': a JSONL's pairs split by one of user, domain"),
    (["data.path=null"], "data.source jsonl needs data.path"),
    (["data.source=synthetic"], "data.path is read with data.source jsonl only"),
    (["split.attribute=user"], "pairs.jsonl:3: field 'user': missing field"),  # the file's third row has no user
])
def test_a_bad_jsonl_config_or_row_is_named(overrides, message, tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.jsonl", drop_user_on=2)
    args = ["data.source=jsonl", f"data.path={data}", *overrides]
    rc, _, err = run_cli(["run", str(config_path("quickstart", quick=True)), *TINY[:-1], *args, "--out",
                          str(tmp_path / "run"), "--no-progress"], capsys)
    assert rc == 2 and message in err




def test_the_reward_model_is_put_on_the_configured_device(no_shared_data):
    """`model.device` places the LoRA reward model (here PyTorch's shape-only "meta" device, as no GPU is here; the
    GPU run is benchmarks/gpu_configs.py's engine part)."""
    from collabalign.commands import load_config
    from collabalign.experiments.quickstart.comparison import prepare

    overrides = [o for o in TINY if not o.startswith("--")]
    for device in ("cpu", "meta"):
        cfg = load_config(config_path("quickstart", quick=True), [*overrides, f"model.device={device}"])[2]
        assert {p.device.type for p in prepare(cfg, []).model.parameters()} == {device}
