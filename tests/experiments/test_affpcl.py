"""The AffPCL reproduction: the quick config through the CLI (every declared claim decided, plots), a toy config twice
(determinism), the configs, and the claims' wiring on crafted inputs."""

import json

import numpy as np
import pytest

from collabalign import claims
from collabalign.cli import config_path, load_config, main
from collabalign.experiments.affpcl import communication, digits, fig1, fig6, reward, rl, sweeps, theory

from .toy import run_twice

PARTS = (fig1, communication, theory, fig6, sweeps, digits, rl, reward)
VERDICTS = {"reproduced", "not reproduced", "inconclusive"}
TOY = ["fig1.runs=4", "fig1.steps=20", "fig1.n=6", "fig1.sets={main_text: [0.0, 0.8], appendix_b: [0.0, 0.5]}",
       "theory.rate_levels=[0.0]", "theory.rate_steps=60", "theory.rate_runs=3", "theory.speedup_n_list=[2, 6]",
       "theory.speedup_deltas=[0.2, 0.5]", "theory.speedup_n=6", "theory.speedup_steps=60", "theory.speedup_runs=3",
       "fig6.n=6", "fig6.steps=20", "fig6.runs=4", "sweeps.runs=3", "sweeps.n=6", "sweeps.steps=20",
       "sweeps.fig4_grid=[0.0, 0.5]", "sweeps.fig5_n=[2, 6]", "sweeps.fig5_deltas=[0.5, 0.1]", "digits.n=4",
       "digits.runs=3", "digits.steps=20", "digits.eval_every=5", "digits.window=2", "digits.levels=[0.0, 1.0]",
       "rl.n=4", "rl.td_runs=3", "rl.td_steps=60", "rl.sarsa_runs=3", "rl.sarsa_steps=60",
       "reward.datasets=[synthetic]", "reward.variants=[r1, r2]", "reward.n_list=[3]", "reward.deltas=[0.0, 1.0]",
       "reward.runs=3", "reward.steps=20", "reward.eval_every=5", "reward.window=2", "reward.synthetic_items=100",
       "reward.synthetic_d=4", "--no-progress"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("affpcl-quick")
    assert main(["reproduce", "affpcl", "--quick", "--out", str(out), "--no-progress"]) == 0
    return out / "affpcl"


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    return run_twice(tmp_path_factory, "affpcl", TOY)


def declared() -> list[claims.Claim]:
    """Every claim the parts declare (module-level constants), each once."""
    found = {v.name: v for part in PARTS for v in vars(part).values() if isinstance(v, claims.Claim)}
    return list(found.values())


def test_every_declared_claim_is_decided_in_the_quick_run(quick):
    summary = json.loads((quick / "summary.json").read_text())
    names = [c["name"] for c in summary["claims"]]
    assert len(declared()) == 28 and len(names) == 42
    for claim in declared():
        decided = [c for c in summary["claims"] if claim.name in c["name"]]
        assert decided, f"{claim.name!r} missing from the quick run"
        assert all(c["rule"] == claim.rule and c["scale"] == claim.scale for c in decided)
    assert all(c["verdict"] in VERDICTS and c["n"] >= 1 for c in summary["claims"])
    assert sum(c["post_hoc"] for c in summary["claims"]) == 3  # Fig. 2 at batch 1
    for plot in ("fig1_main_text", "fig1_appendix_b", "fig6_agents", "theory_rate", "theory_speedup",
                 "fig4_improvement", "fig5_contours", "fig2_digits_batch32", "fig2_digits_batch1", "fig3_td",
                 "fig3_sarsa"):
        assert (quick / "plots" / f"{plot}.png").stat().st_size > 1000
    report = (quick / "report.md").read_text()
    assert report.count("| AffPCL matches FedAvg in the homogeneous setting |") == 1 and "Smoke run" in report
    assert "Reward models, synthetic/r2: expected held-out preference accuracy" in report


def test_quick_run_records_and_communication(quick):
    records = [json.loads(x) for x in (quick / "metrics.jsonl").read_text().splitlines()]
    cfg = load_config(config_path("affpcl", quick=True))[2]
    per_figure = {f: sum(r["figure"] == f for r in records) for f in ("fig1", "fig2", "fig3_td", "fig3_sarsa")}
    assert per_figure["fig2"] == len(cfg.digits.batches) * len(cfg.digits.levels) * 7 * (cfg.digits.steps // 10)
    assert per_figure["fig1"] == 6 * 8 * cfg.fig1.steps  # 6 levels, 7 methods and AffPCL's agent 1
    summary = json.loads((quick / "summary.json").read_text())
    remark = next(c for c in summary["claims"] if c["name"].startswith("Remark 1"))
    assert remark["verdict"] == "reproduced" and remark["estimate"] == 3.5
    assert remark["measured"]["simulator_vs_vectorised_max_rel_gap"] < 1e-5
    ledger = (quick / "ledger.csv").read_text().splitlines()
    assert ledger[0] == "method,round,client,direction,bytes" and len(ledger) == 1 + 2 * 2 * 20 * cfg.fig1.steps


def test_toy_records_hold_mean_and_median_curves_per_method(toy_runs):
    records = [json.loads(x) for x in (toy_runs[0] / "metrics.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in records if r["figure"] == "fig1"}
    assert methods == {"il", "fedavg", "affpcl", "finetune", "pfedme", "ditto", "ifca", "affpcl_agent1"}
    affpcl = [r for r in records if r["figure"] == "fig1" and r["method"] == "affpcl" and r["level"] == 0.8]
    assert [r["round"] for r in affpcl] == list(range(1, 21))
    assert all(r["mse0_mean"] > 0 and r["mse0_median"] > 0 for r in affpcl)
    assert len(json.loads((toy_runs[0] / "summary.json").read_text())["claims"]) == 41


def test_same_config_and_seed_give_byte_identical_outputs(toy_runs):
    a, b = toy_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


@pytest.mark.parametrize("name", ["quick", "main"])
def test_configs_validate_and_main_has_five_runs_wherever_methods_are_compared(name):
    experiment, _, cfg, smoke = load_config(config_path("affpcl", quick=name == "quick"))
    assert experiment == "affpcl" and smoke == (name == "quick")
    assert cfg.fig1.sets["main_text"] == [0.0, 0.05, 0.3, 0.8] and cfg.fig1.sets["appendix_b"] == [0.0, 0.05, 0.2, 0.5]
    assert all(part.run for part in (cfg.theory, cfg.fig6, cfg.sweeps, cfg.digits, cfg.rl, cfg.reward))
    if name == "main":
        runs = [cfg.fig1.runs, cfg.theory.rate_runs, cfg.theory.speedup_runs, cfg.fig6.runs, cfg.sweeps.runs,
                cfg.digits.runs, cfg.rl.td_runs, cfg.rl.sarsa_runs, cfg.reward.runs]
        assert min(runs) >= 5 and cfg.reward.n_list == [5, 10, 20, 50] and "hh" in cfg.reward.datasets


def test_declared_claims_carry_their_rule_and_margin():
    assert fig1.HOMOGENEOUS.rule == "non-inferiority" and fig1.HOMOGENEOUS.margin == 0.5
    assert fig1.HOMOGENEOUS.scale == "ratio" and fig1.HOMOGENEOUS.lower_is_better
    assert fig1.CENTRE.rule == "superiority" and fig1.CENTRE.margin == 1.0  # smallest effect: a 2x speed-up
    assert fig6.GENERIC.rule == "equivalence" and fig6.GENERIC.margin == 0.5
    assert theory.RATE.band == (-1.25, -0.75) and theory.SPEEDUP.band == (0.7, 1.3)
    assert rl.TD_SPEEDUP.band == (0.5, 2.0) and rl.TD_SPEEDUP.scale == "ratio"
    assert reward.BEST.margin == reward.POOLED.margin == reward.AT_LEAST_IL.margin == 0.01
    assert communication.REMARK_1.rule == "exact" and communication.REMARK_1.tolerance == 0.5
    assert not any(c.post_hoc for c in declared())


def runs(value: float, spread: float = 0.05, n: int = 6, seed: int = 0) -> np.ndarray:
    """n positive replicates around `value` (multiplicative noise)."""
    return value * np.exp(spread * np.random.default_rng(seed).standard_normal(n))


def fig1_last(affpcl: float, rival: float, levels=(0.0, 0.8)) -> dict:
    methods = ["il", "fedavg", "finetune", "pfedme", "ditto", "ifca"]
    out = {}
    for lv in levels:
        out[lv] = {m: runs(rival, seed=k) for k, m in enumerate(methods)}
        out[lv].update(affpcl=runs(affpcl, seed=9), affpcl_agent1=runs(affpcl, seed=10), il_agent1=runs(rival, seed=11))
    return out


@pytest.mark.parametrize("affpcl,verdicts", [
    (0.2, ("reproduced", "reproduced", "reproduced")),  # 5x better than every rival, agent 1 too
    (3.0, ("not reproduced", "not reproduced", "not reproduced"))])  # 3x worse
def test_fig1_claims_on_crafted_errors(affpcl, verdicts):
    cfg = fig1.Fig1Config()
    decided = fig1.set_claims(cfg, "main_text", [0.0, 0.8], fig1_last(affpcl, 1.0))
    assert tuple(c["verdict"] for c in decided) == verdicts
    assert decided[0]["name"] == "[main_text] AffPCL matches independent learning at the highest heterogeneity (0.8)"
    assert decided[1]["holm"]["cells"] == 12


def test_a_tie_within_the_margin_confirms_non_inferiority_but_not_a_speed_up():
    decided = fig1.set_claims(fig1.Fig1Config(), "set", [0.0, 0.8], fig1_last(1.0, 1.0))
    assert [c["verdict"] for c in decided] == ["reproduced", "reproduced", "not reproduced"]


def test_digits_claims_on_crafted_errors_and_batch_1_is_post_hoc():
    cfg = digits.DigitsConfig(levels=[0.0, 1.0])
    last = {lv: {m: runs(1.0, seed=k) for k, m in enumerate(digits.LABELS)} for lv in cfg.levels}
    for lv in cfg.levels:
        last[lv]["affpcl"] = runs(0.5, seed=20)
    last[0.0]["fedavg"], last[1.0]["fedavg"] = runs(0.8, seed=21), runs(1.3, seed=22)  # FedAvg and IL swap order
    decided = digits.batch_claims("Fig. 2, batch 1", cfg, last, post_hoc=True)
    assert [c["verdict"] for c in decided] == ["reproduced"] * 3 and all(c["post_hoc"] for c in decided)
    last[1.0]["fedavg"] = runs(0.8, seed=23)  # FedAvg better at both ends: no flip
    assert digits.batch_claims("x", cfg, last, post_hoc=False)[2]["verdict"] == "not reproduced"


def test_rl_claims_on_crafted_errors():
    cfg = rl.RLConfig(n=10)
    td = {lv: {"il": runs(1.0, seed=1), "fedavg": runs(0.11, seed=2), "affpcl": runs(0.1, seed=3)} for lv in (0, 1)}
    assert [c["verdict"] for c in rl.td_claims(cfg, td)] == ["reproduced"] * 3  # n x ratio = 1, inside [0.5, 2]
    td[0]["affpcl"] = runs(0.5, seed=4)  # only a 2x gain at n = 10: outside the band
    assert rl.td_claims(cfg, td)[2]["verdict"] == "not reproduced"
    sarsa = {lv: {"il": runs(1.0, seed=5), "fedavg": runs(1.0, seed=6), "affpcl": runs(0.5, seed=7),
                  "affpcl_dre": runs(2.0, seed=8)} for lv in (0, 1)}
    assert [c["verdict"] for c in rl.sarsa_claims(sarsa)] == ["reproduced", "not reproduced"]


def test_reward_claims_on_crafted_accuracies():
    cfg = reward.RewardConfig(n_list=[5, 10], deltas=[0.0, 1.0])
    acc = {}
    for n in cfg.n_list:
        for d in cfg.deltas:
            acc[n, d] = {m: 0.7 + 0.002 * np.random.default_rng(k + n).standard_normal(5)
                         for k, m in enumerate(reward.BASELINES)}
            acc[n, d].update(affpcl=acc[n, d]["fedavg"] + 0.003, affpcl_dre=acc[n, d]["il"] - 0.05,
                             affpcl_plugin=acc[n, d]["fedavg"].copy())
    decided = reward.variant_claims(cfg, "reward synthetic r2", "r2", acc)
    assert [c["verdict"] for c in decided] == ["reproduced"] * 3 + ["not reproduced"] * 4
    assert decided[0]["holm"]["cells"] == 2 * 2 * 4


def test_theory_and_sweep_fits_on_exact_power_laws():
    t = np.arange(100, 400)
    assert theory.RATE.decide(claims.slopes(t, np.stack([3 / t, 5 / t, 2 / t, 7 / t])))["verdict"] == "reproduced"
    x = np.array([0.5, 0.2, 0.1, 0.05])
    curves = np.stack([0.8 * x, 0.6 * x ** 1.1, 0.7 * x ** 0.9])
    assert theory.SPEEDUP.decide(claims.slopes(x, curves))["verdict"] == "reproduced"
    y = np.stack([2 * x + 1, -x + 3 + 0.01 * np.sin(7 * x)])
    r2 = sweeps.r_squared(x, y)
    assert r2[0] == pytest.approx(1.0) and 0.99 < r2[1] < 1.0
