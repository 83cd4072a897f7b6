"""The federated fine-tuning comparison (experiments/fed_tune) on the example pairs and the tiny Llama: every arm runs
and is cached, the gate decides before the orderings, and a pilot scores on training pairs only."""

import json

import pytest

from collabalign.examples import write_examples
from collabalign.experiments import fed_tune
from collabalign.experiments.fed_tune.comparison import arms, seed_rows
from collabalign.runs import RunDir

SMALL = {"seeds": [0, 1, 2], "optimizers": {"fedavg": {}, "scaffold": {"rule": "scaffold"}}, "upload_bits": [8],
         "data": {"source": "jsonl", "split_key": "domain", "max_pairs": 48, "max_prompt_tokens": 64,
                  "max_response_tokens": 6},  # the cost: response tokens x the 49k-token vocabulary
         "train": {"model": "tiny-llama", "clients": 2, "rounds": 1, "local_steps": 2, "batch_size": 4, "lr": 0.01}}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    pairs = write_examples(tmp_path_factory.mktemp("examples"))["pairs"]
    return fed_tune.Config(**SMALL | {"data": SMALL["data"] | {"path": str(pairs)}})


def test_every_arm_runs_and_a_second_run_reads_them_back(config, tmp_path):
    run = RunDir(tmp_path / "run")
    fed_tune.run(config, run, progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    names = [c["name"] for c in summary["claims"]]
    assert names[:2] == ["federated SFT is learned", "centralised SFT is learned"]
    assert "federated DPO is learned" in names and "dpo: 8-bit uploads are no worse than float32" in names
    table = summary["metrics"]["mean_score"]
    assert set(table) == {"sft", "dpo"} and set(table["sft"]) == set(arms(config))
    assert table["sft"]["iid/fedavg"] > table["sft"]["base"]  # minus NLL: SFT learns the example replies
    ranking = summary["metrics"]["dpo_own_ranking"]  # the trained policy's own log-prob ranking, per arm
    assert set(ranking) == set(arms(config)) and all(0 <= v <= 1 for v in ranking.values())
    up = summary["metrics"]["up_bytes_seed0"]["sft"]
    assert up["iid/fedavg-8bit"] < 0.3 * up["iid/fedavg"] and up["iid/scaffold"] > up["iid/fedavg"]  # + Δc_i
    assert sorted(p.name for p in (tmp_path / "run" / "plots").glob("*_scores.png")) == ["dpo_scores.png",
                                                                                         "sft_scores.png"]
    cached = sorted(p.name for p in (tmp_path / "run" / "fed_tune_runs").iterdir())
    assert len(cached) == 2 * 3 * len(arms(config))
    fed_tune.run(config, RunDir(tmp_path / "run"), progress=False)  # everything cached: the same summary
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["claims"] == summary["claims"]


def test_others_off_the_iid_split_leave_only_fedavg_there(config):
    lean = arms(config.model_copy(update={"others_on_iid": False}))
    assert "iid/scaffold" not in lean and {"iid/fedavg", "dirichlet/scaffold", "iid/fedavg-8bit"} <= set(lean)
    assert set(arms(config)) - set(lean) == {"iid/scaffold"}


def test_a_pilot_scores_on_training_pairs_and_never_on_the_test_pairs(config, tmp_path):
    from collabalign.experiments.fed_tune.comparison import prepare
    setup = prepare(config, tmp_path / "cache", progress=False)
    test, clients = seed_rows(config, setup, 0)
    pilot = config.model_copy(update={"validation": True})
    scored, pilot_clients = seed_rows(pilot, setup, 0)
    train = {int(r) for rows in pilot_clients["iid"].values() for r in rows}
    assert not set(test.tolist()) & (set(scored.tolist()) | train)
    assert not set(scored.tolist()) & train


def test_main_and_gpu_configs_validate_and_the_gpu_config_runs_on_a_tiny_stand_in(tmp_path):
    from collabalign.cli import main
    from collabalign.commands import CONFIG_DIR, load_config
    from collabalign.models.backbones import tiny_llama

    main_cfg = load_config(CONFIG_DIR / "fed_tune" / "main.yaml")[2]
    assert main_cfg.seeds == [0, 1, 2, 3, 4] and len(main_cfg.optimizers) == 7 and main_cfg.upload_bits == [8, 4]
    assert not main_cfg.validation and main_cfg.objectives == ["sft"] and main_cfg.train.lr == 0.01
    stand_in = tiny_llama(seed=3)
    stand_in.model.save_pretrained(tmp_path / "policy")
    stand_in.tokenizer.save_pretrained(tmp_path / "policy")
    pairs = write_examples(tmp_path / "examples")["pairs"]
    args = ["run", str(CONFIG_DIR / "fed_tune" / "gpu_qwen.yaml"), f"train.model={tmp_path / 'policy'}",
            "train.device=cpu", "train.clients=2", "train.rounds=1", "train.local_steps=1", "train.batch_size=4",
            "seeds=[0, 1, 2]", "objectives=[dpo]", "optimizers={fedavg: {}}", "upload_bits=[]",
            f"data={{source: jsonl, path: {pairs}, split_key: domain, max_pairs: 24, max_response_tokens: 8}}",
            "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(args) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["claims"][0]["name"] == "federated DPO is learned"
