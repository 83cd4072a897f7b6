"""The AffPCL reproduction through the CLI at toy size: claims with verdicts, plots and determinism."""

import json

import numpy as np
import pytest

from collabalign.cli import config_path, load_config
from collabalign.experiments.affpcl_digits import digits_claims
from collabalign.methods.affpcl.digits import DIGITS_METHODS
from collabalign.runs import RunDir
from collabalign.seeding import Seeds

from .toy import run_twice

TOY = ["fig1.runs=4", "fig1.steps=20", "fig1.n=6", "fig1.sets={main_text: [0.0, 0.8], appendix_b: [0.0, 0.5]}",
       "theory.rate_levels=[0.0]", "theory.rate_steps=60", "theory.rate_runs=2", "theory.speedup_n_list=[2, 6]",
       "theory.speedup_deltas=[0.2, 0.5]", "theory.speedup_n=6", "theory.speedup_steps=60", "theory.speedup_runs=2",
       "theory.agent_n=6", "theory.agent_steps=20", "theory.agent_runs=4", "sweeps.runs=2", "sweeps.n=6",
       "sweeps.steps=20", "sweeps.fig4_grid=[0.0, 0.5]", "sweeps.fig5_n=[2, 6]", "sweeps.fig5_deltas=[0.5, 0.1]",
       "digits.n=4", "digits.runs=2", "digits.steps=20", "digits.eval_every=5", "digits.window=2",
       "digits.levels=[0.0, 1.0]", "rl.n=4", "rl.td_runs=2", "rl.td_steps=60", "rl.sarsa_runs=2", "rl.sarsa_steps=60",
       "reward.datasets=[synthetic]", "reward.variants=[r1, r2]", "reward.n_list=[3]", "reward.deltas=[0.0, 1.0]",
       "reward.runs=2", "reward.steps=20", "reward.eval_every=5", "reward.window=2", "reward.synthetic_items=100",
       "reward.synthetic_d=4", "reward.boot=100", "--no-progress"]


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    return run_twice(tmp_path_factory, "affpcl", TOY)


def test_every_claim_is_reported_with_a_verdict_and_plots_are_written(toy_runs):
    summary = json.loads((toy_runs[0] / "summary.json").read_text())
    names = [c["name"] for c in summary["claims"]]
    assert len(names) == 41 and names[0] == "AffPCL matches FedAvg in the homogeneous setting"
    assert sum(n.startswith("[appendix_b]") for n in names) == 4
    assert sum(n.startswith("[Fig. 2, batch") for n in names) == 8 and sum("[Fig. 3" in n for n in names) == 5
    assert sum(n.startswith("[reward synthetic") for n in names) == 10
    assert set(summary["metrics"]["reward_models"]["accuracy_mean_over_n"]) == {"synthetic/r1", "synthetic/r2"}
    assert set(json.loads((toy_runs[0] / "reward_table.json").read_text())) == {"synthetic/r1", "synthetic/r2"}
    assert set(summary["metrics"]["fig3_rl"]["sarsa"]["1"]) == {"il", "fedavg", "affpcl", "affpcl_dre"}
    assert {c["verdict"] for c in summary["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
    assert set(summary["metrics"]["fig1_last10_mse0"]) == {"0", "0.5", "0.8"}
    assert "slope" in summary["metrics"]["theory"]["speedup"]
    assert len(summary["metrics"]["fig4"]["improvement_vs_il"]) == 2 and "r2_log_mse" in summary["metrics"]["fig5"]
    for plot in ("fig1_main_text", "fig1_appendix_b", "fig6_agents", "theory_rate", "theory_speedup",
                 "fig4_improvement", "fig5_contours", "fig2_digits_batch32", "fig2_digits_batch1", "fig3_td",
                 "fig3_sarsa"):
        assert (toy_runs[0] / "plots" / f"{plot}.png").stat().st_size > 1000
    report = (toy_runs[0] / "report.md").read_text()
    assert "| AffPCL matches FedAvg in the homogeneous setting |" in report
    assert "Reward models, synthetic/r2: expected held-out preference accuracy" in report
    communication = next(c for c in summary["claims"] if c["name"].startswith("Remark 1"))
    assert communication["verdict"] == "reproduced" and communication["measured"]["payload_ratio"] == 3.5
    assert communication["measured"]["simulator_vs_vectorised_max_rel_gap"] < 1e-5
    ledger = (toy_runs[0] / "ledger.csv").read_text().splitlines()
    assert ledger[0] == "method,round,client,direction,bytes" and len(ledger) == 1 + 2 * 2 * 6 * 20


def test_records_hold_mean_and_median_curves_per_method(toy_runs):
    records = [json.loads(x) for x in (toy_runs[0] / "metrics.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in records if r["figure"] == "fig1"}
    assert methods == {"il", "fedavg", "affpcl", "finetune", "pfedme", "ditto", "ifca", "affpcl_agent1"}
    affpcl = [r for r in records if r["figure"] == "fig1" and r["method"] == "affpcl" and r["level"] == 0.8]
    assert [r["round"] for r in affpcl] == list(range(1, 21))
    assert all(r["mse0_mean"] > 0 and r["mse0_median"] > 0 for r in affpcl)


def test_same_config_and_seed_give_byte_identical_outputs(toy_runs):
    a, b = toy_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


@pytest.mark.parametrize("name", ["quick", "main"])
def test_configs_validate(name):
    experiment, _, cfg, smoke = load_config(config_path("affpcl", quick=name == "quick"))
    assert experiment == "affpcl" and smoke == (name == "quick")
    assert cfg.fig1.sets["main_text"] == [0.0, 0.05, 0.3, 0.8] and cfg.fig1.sets["appendix_b"] == [0.0, 0.05, 0.2, 0.5]
    assert cfg.reward.run and (cfg.reward.datasets == ["synthetic"] if name == "quick" else
                               cfg.reward.n_list == [5, 10, 20, 50] and "hh" in cfg.reward.datasets)


def test_digits_figure_runs_on_the_quick_config(tmp_path):
    """Fig. 2 (digits substitute) exactly as the quick config sets it: every claim, plot and evaluation record."""
    cfg = load_config(config_path("affpcl", quick=True))[2].digits
    metrics = {}
    claims, records = digits_claims(cfg, Seeds(0), metrics, RunDir(tmp_path), np.random.default_rng(0), False)
    assert len(claims) == 4 * len(cfg.batches) and {c["verdict"] for c in claims} <= {
        "reproduced", "not reproduced", "inconclusive"}
    assert len(records) == len(cfg.batches) * len(cfg.levels) * len(DIGITS_METHODS) * (cfg.steps // cfg.eval_every)
    assert metrics["fig2_digits"]["pretrain_accuracy"] > 0.85
    final = metrics["fig2_digits"]["final_test_mse"][str(cfg.batches[0])]
    assert all(0 < v["mean"] < 1 for by in final.values() for v in by.values())
    for batch in cfg.batches:
        assert (tmp_path / "plots" / f"fig2_digits_batch{batch}.png").stat().st_size > 1000
