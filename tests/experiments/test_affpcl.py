"""The AffPCL reproduction: the quick config through the CLI (every declared claim decided, plots), a toy config twice
(determinism), the configs, and the claims' wiring on crafted inputs."""

import json

import numpy as np
import pytest

from collabalign import claims
from collabalign.cli import main
from collabalign.commands import config_path, load_config
from collabalign.experiments.affpcl import checks, communication, digits, fig1, fig6, reward, rl, sweeps, theory
from collabalign.methods.affpcl import AffPCL, GaussianSystems, LocalAffPCL, LocalFedAvg
from collabalign.seeding import Seeds

from .plots import unrendered
from .toy import run_twice

PARTS = (fig1, communication, theory, checks, fig6, sweeps, digits, rl, reward)
VERDICTS = {"reproduced", "not reproduced", "inconclusive"}
TOY = ["fig1.runs=4", "fig1.steps=20", "fig1.n=6", "fig1.sets={main_text: [0.0, 0.8], appendix_b: [0.0, 0.5]}",
       "theory.rate_levels=[0.0]", "theory.rate_steps=60", "theory.rate_runs=3", "theory.speedup_n_list=[2, 6]",
       "theory.speedup_deltas=[0.2, 0.5]", "theory.speedup_n=6", "theory.speedup_steps=60", "theory.speedup_runs=3",
       "fig6.n=6", "fig6.steps=20", "fig6.runs=4", "sweeps.runs=3", "sweeps.n=6", "sweeps.steps=20",
       "sweeps.fig4_grid=[0.0, 0.5]", "sweeps.fig5_n=[2, 6]", "sweeps.fig5_deltas=[0.5, 0.1]", "checks.runs=3",
       "checks.steps=60", "checks.central_n=[3, 6]", "checks.n=6", "checks.ic_levels=[0.5]", "checks.ic_draws=20",
       "checks.kappas=[0.0, 2.0]", "checks.dre_deltas=[0.1, 0.8]", "checks.dre_runs=3", "digits.n=4", "digits.runs=3",
       "digits.rounds=4", "digits.local=5", "digits.window=2", "digits.per_step.steps=20",
       "digits.per_step.eval_every=5", "digits.per_step.window=2", "digits.levels=[0.0, 1.0]",
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
    """The toy runs' tests read their records and summaries only; the quick run above renders and checks every plot,
    so these two build the figures but neither lay them out nor render them (most of a toy run's time)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        unrendered(monkeypatch)
        return run_twice(tmp_path_factory, "affpcl", TOY)


def declared() -> list[claims.Claim]:
    """Every claim the parts declare (module-level constants), each once."""
    found = {v.name: v for part in PARTS for v in vars(part).values() if isinstance(v, claims.Claim)}
    return list(found.values())


def test_every_declared_claim_is_decided_in_the_quick_run(quick):
    summary = json.loads((quick / "summary.json").read_text())
    names = [c["name"] for c in summary["claims"]]
    assert len(declared()) == 32 and len(names) == 50
    for claim in declared():
        decided = [c for c in summary["claims"] if claim.name in c["name"]]
        assert decided, f"{claim.name!r} missing from the quick run"
        assert all(c["rule"] == claim.rule and c["scale"] == claim.scale for c in decided)
    assert all(c["verdict"] in VERDICTS and c["n"] >= 1 for c in summary["claims"])
    assert sum(c["post_hoc"] for c in summary["claims"]) == 3  # Fig. 2's per-step ablation at batch 1
    for plot in ("fig1_main_text", "fig1_appendix_b", "fig6_agents", "theory_rate", "theory_speedup",
                 "fig4_improvement", "fig5_contours", "fig2_digits_paper", "fig2_digits_per_step_batch32",
                 "fig2_digits_per_step_batch1", "fig3_td", "fig3_sarsa"):
        assert (quick / "plots" / f"{plot}.png").stat().st_size > 1000
    report = (quick / "report.md").read_text()
    assert report.count("| AffPCL matches FedAvg in the homogeneous setting |") == 1 and "Smoke run" in report
    assert "Reward models, synthetic/r2: expected held-out preference accuracy" in report


def test_quick_run_records_and_communication(quick):
    records = [json.loads(x) for x in (quick / "metrics.jsonl").read_text().splitlines()]
    cfg = load_config(config_path("affpcl", quick=True))[2]
    per_figure = {f: sum(r["figure"] == f for r in records) for f in ("fig1", "fig2", "fig3_td", "fig3_sarsa")}
    dig = cfg.digits
    paper = [r for r in records if r["figure"] == "fig2" and r["setting"] == "paper"]
    assert len(paper) == len(dig.levels) * 3 * dig.rounds  # IL, FedAvg, AffPCL: one evaluation per round
    assert sorted({r["step"] for r in paper}) == [dig.local * (k + 1) for k in range(dig.rounds)]
    per_step = len(dig.per_step.batches) * len(dig.levels) * 7 * (dig.per_step.steps // dig.per_step.eval_every)
    assert per_figure["fig2"] == len(paper) + per_step
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
    assert len(json.loads((toy_runs[0] / "summary.json").read_text())["claims"]) == 49


def test_same_config_and_seed_give_byte_identical_outputs(toy_runs):
    a, b = toy_runs
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()


@pytest.mark.parametrize("name", ["quick", "main"])
def test_configs_validate_and_main_has_five_runs_wherever_methods_are_compared(name):
    experiment, _, cfg, smoke = load_config(config_path("affpcl", quick=name == "quick"))
    assert experiment == "affpcl" and smoke == (name == "quick")
    assert cfg.fig1.sets["main_text"] == [0.0, 0.05, 0.3, 0.8] and cfg.fig1.sets["appendix_b"] == [0.0, 0.05, 0.2, 0.5]
    assert all(part.run for part in (cfg.theory, cfg.checks, cfg.fig6, cfg.sweeps, cfg.digits, cfg.rl, cfg.reward))
    # Fig. 2 as the paper ran it (App. B): step 0.002, batch 32, 70 samples between rounds, no importance correction
    assert (cfg.digits.alpha, cfg.digits.batch, cfg.digits.local) == (0.002, 32, 70) and cfg.digits.per_step.run
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
    assert checks.CENTRAL.band == (-1.3, -0.7)
    assert checks.SERVER_SIDE.rule == "superiority" and checks.SERVER_SIDE.lower_is_better
    assert checks.SERVER_SIDE.scale == "ratio" and checks.SERVER_SIDE.margin == 0.0
    assert checks.NU_GAIN.rule == "superiority" and checks.NU_GAIN.margin == 0.0
    assert checks.DRE_FLOOR.rule == "non-inferiority" and checks.DRE_FLOOR.margin == 0.5
    assert checks.DRE_FLOOR.lower_is_better and checks.DRE_FLOOR.scale == "difference"
    assert not any(c.post_hoc for c in declared())


def test_one_sided_claims_are_non_inferiority_with_a_declared_margin():
    one_sided = [c for c in declared()
                 if any(w in c.name.lower() for w in ("matches", "never worse", "at least", "lowest", "best or tied",
                                                      "does not"))]
    assert len(one_sided) == 14
    for claim in one_sided:
        assert claim.rule == "non-inferiority" and claim.margin > 0, claim.name
    assert {c.margin for c in one_sided if c.scale == "ratio"} == {0.5}  # MATCH: a factor 1.5


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


@pytest.mark.parametrize("labels,cells", [(digits.PAPER_LABELS, 2 * 2), (digits.LABELS, 2 * 6)])
def test_digits_claims_on_crafted_errors_against_every_method_run(labels, cells):
    levels = [0.0, 1.0]
    last = {lv: {m: runs(1.0, seed=k) for k, m in enumerate(labels)} for lv in levels}
    for lv in levels:
        last[lv]["affpcl"] = runs(0.5, seed=20)
    last[0.0]["fedavg"], last[1.0]["fedavg"] = runs(0.8, seed=21), runs(1.3, seed=22)  # FedAvg and IL swap order
    decided = digits.setting_claims("Fig. 2 ablation", levels, last, post_hoc=True)
    assert [c["verdict"] for c in decided] == ["reproduced"] * 3 and all(c["post_hoc"] for c in decided)
    assert decided[1]["holm"]["cells"] == cells
    last[1.0]["fedavg"] = runs(0.8, seed=23)  # FedAvg better at both ends: no flip
    assert digits.setting_claims("x", levels, last, post_hoc=False)[2]["verdict"] == "not reproduced"
    last[0.0]["affpcl"] = runs(2.0, seed=24)  # AffPCL 2.5x FedAvg at delta_obj = 0: beyond the 1.5 margin
    assert digits.setting_claims("x", levels, last, post_hoc=False)[0]["verdict"] == "not reproduced"


def test_fig2_follows_the_paper_setting_and_keeps_the_old_one_as_an_ablation():
    cfg = digits.DigitsConfig()
    assert (cfg.alpha, cfg.batch, cfg.local) == (0.002, 32, 70)
    paper, *ablation = digits.settings(cfg)
    assert paper.methods == {"il": paper.methods["il"], "fedavg": LocalFedAvg(70), "affpcl": LocalAffPCL(70)}
    assert (paper.batch, paper.alpha, paper.steps, paper.every) == (32, 0.002, cfg.rounds * 70, 70)
    assert not any(isinstance(m, AffPCL) for m in paper.methods.values())  # LocalAffPCL: no importance correction
    assert [s.name for s in ablation] == ["per_step_batch32", "per_step_batch1"]
    assert all(s.tag.startswith("Fig. 2 ablation") and s.alpha == 1.0 and s.every == 10 for s in ablation)
    assert ablation[0].methods["affpcl"].weights == "exact" and ablation[0].methods["affpcl_no_ic"].weights == "none"
    custom = digits.settings(digits.DigitsConfig(alpha=0.01, batch=8, local=5, rounds=3, per_step={"run": False}))
    assert [(s.batch, s.alpha, s.steps, s.every, s.methods["affpcl"].local) for s in custom] == [(8, 0.01, 15, 5, 5)]


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


def test_theory_checks_on_crafted_values():
    n = np.array([5, 10, 20, 40])
    assert checks.CENTRAL.decide(claims.slopes(n, np.stack([c / n for c in (1, 2, 3)])))["verdict"] == "reproduced"
    flat = np.stack([c + 0 * n for c in (1.0, 1.1, 0.9)])
    assert checks.CENTRAL.decide(claims.slopes(n, flat))["verdict"] == "not reproduced"
    server, client = runs(1.0, seed=1), runs(3.0, seed=2)
    assert checks.SERVER_SIDE.decide_cells({"a": (server, client)})["verdict"] == "reproduced"
    assert checks.SERVER_SIDE.decide_cells({"a": (client, server)})["verdict"] == "not reproduced"
    nu = np.array([1.0, 2.0, 4.0, 8.0])
    shrinking = np.stack([0.05 * nu ** 0.5 * runs(1.0, n=4, seed=k) for k in range(4)])
    assert checks.NU_GAIN.decide(claims.slopes(nu, shrinking), 0.0)["verdict"] == "reproduced"
    delta = np.array([0.05, 0.1, 0.2, 0.4])
    floor = np.stack([0.02 * runs(1.0, n=4, seed=k) for k in range(5)])  # ~ d / t whatever delta_env
    assert checks.DRE_FLOOR.decide(claims.slopes(delta, floor), 0.0)["verdict"] == "reproduced"
    square_law = np.stack([delta ** 2 * runs(1.0, n=4, seed=k) for k in range(5)])  # delta^2 / t: ruled out
    assert checks.DRE_FLOOR.decide(claims.slopes(delta, square_law), 0.0)["verdict"] == "not reproduced"


def test_theory_checks_are_each_decided_on_a_small_config():
    cfg = checks.ChecksConfig(runs=3, steps=60, central_n=[3, 6], n=4, ic_levels=[0.5], ic_draws=10,
                              kappas=[0.0, 2.0], dre_deltas=[0.1, 0.8], dre_runs=3)
    part = checks.part(cfg, Seeds(0))
    expected = [checks.CENTRAL, checks.CENTRAL, checks.SERVER_SIDE, checks.NU_GAIN, checks.DRE_FLOOR]
    assert len(part.claims) == len(expected)
    for record, claim in zip(part.claims, expected, strict=True):
        assert record["name"].startswith(claim.name) and record["rule"] == claim.rule
    assert all(c["verdict"] in VERDICTS and c["n"] == 3 for c in part.claims)
    nu = part.metrics["theory_checks"]["noise_alignment"]
    assert nu["mean_nu"][0] == pytest.approx(1.0) and nu["mean_nu"][1] > 2
    assert part.metrics["theory_checks"]["central"]["x0_vs_xc_relative_gap"] > 0  # x^0_* != x^c_* under shift


def test_server_and_client_side_corrections_coincide_without_environment_shift():
    system = GaussianSystems(np.random.default_rng(0), 2, 4, delta_obj=0.5)
    batch = system.sample(system.draw(1, np.random.default_rng(1)), 0, None)
    server, client = checks.directions(system, batch)
    np.testing.assert_allclose(server, client, rtol=1e-10, atol=1e-12)
    shifted = GaussianSystems(np.random.default_rng(0), 2, 4, delta_env=0.8, delta_obj=0.5)
    assert not np.allclose(*checks.directions(shifted, shifted.sample(shifted.draw(1, np.random.default_rng(1)), 0,
                                                                     None)))
