"""The synthetic parts of the FIRM reproduction (R0-R3): the quick config's parts run and decide every declared claim
(with rule, n, estimate, interval and margin), the records, ledger and plots, determinism, the configs, and the
claims' wiring on crafted inputs."""

import json

import numpy as np
import pytest

from collabalign import claims
from collabalign.commands import config_path, load_config
from collabalign.experiments import firm
from collabalign.experiments.firm import momdp, quadratic, solver_checks, toy
from collabalign.methods.firm.rules import Traffic
from collabalign.report import write_report
from collabalign.runs import RunDir
from collabalign.seeding import Seeds

from .plots import unrendered

PARTS = (solver_checks, quadratic, momdp, toy)
VERDICTS = {"reproduced", "not reproduced", "inconclusive"}
KEYS = {"name", "expected", "verdict", "rule", "n", "estimate", "interval", "margin", "post_hoc", "measured"}


def run_parts(cfg, path):
    """The synthetic parts as `firm.run` composes them (the language-model parts live beside them)."""
    run, seeds = RunDir(path), Seeds(cfg.seed)
    run.write_config({"experiment": "firm", "smoke": True})
    parts = [solver_checks.part(cfg.solver, seeds, run), quadratic.part(cfg.quadratic, seeds, run, False),
             momdp.part(cfg.momdp, seeds, run, False), toy.part(cfg.toy, seeds, run, False)]
    run.write_parts(parts, plot_metrics=[])
    write_report(path, firm.TITLE)
    return path


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    cfg = load_config(config_path("firm", quick=True))[2]
    return run_parts(cfg, tmp_path_factory.mktemp("firm-quick"))


def declared() -> list[claims.Claim]:
    found = {v.name: v for part in PARTS for v in vars(part).values() if isinstance(v, claims.Claim)}
    return list(found.values())


def test_every_declared_claim_is_decided_with_its_numbers(quick):
    summary = json.loads((quick / "summary.json").read_text())
    assert len(declared()) == 31
    for claim in declared():
        decided = [c for c in summary["claims"] if claim.name in c["name"]]
        assert decided, f"{claim.name!r} missing from the quick run"
        for c in decided:
            assert KEYS <= set(c) and c["rule"] == claim.rule and c["verdict"] in VERDICTS
            assert c["margin"] == claim._declared_margin() and not c["post_hoc"]
            assert c["n"] >= 1 and c["estimate"] is not None
            if c["rule"] != "exact":
                assert c["n"] >= 3 and c["interval"] is not None and c["interval"][0] <= c["interval"][1]
    exact = [c for c in summary["claims"] if c["rule"] == "exact"]
    assert all(c["verdict"] == "reproduced" for c in exact)  # solver checks, lemmas and bytes are deterministic
    report = (quick / "report.md").read_text()
    assert "Smoke run" in report and "R1: FIRM uploads d floats per client per round" in report


def test_records_ledger_and_plots(quick):
    cfg = load_config(config_path("firm", quick=True))[2]
    records = [json.loads(x) for x in (quick / "metrics.jsonl").read_text().splitlines()]
    r1 = [r for r in records if r["part"] == "r1" and r["setting"] == "sigma=2"]
    assert len(r1) == cfg.quadratic.rounds * (len(cfg.quadratic.betas) + len(cfg.quadratic.baselines))
    assert {r["method"] for r in records if r["part"] == "r2"} >= {"beta=0 eta=1/t", "beta=0.01 eta=1"}
    assert {r["group"] for r in records if r["part"] == "r3"} == {"main", "rq2 independent", "rq2 correlated", "big"}
    ledger = (quick / "ledger.csv").read_text().splitlines()
    C, T, K = cfg.quadratic.clients, cfg.quadratic.rounds, cfg.quadratic.local_steps
    fmol = [row for row in ledger if row.startswith("r1 M=2 fmol,")]
    assert ledger[0] == "method,round,client,direction,bytes" and len(fmol) == C * T * (2 + 2 * K)
    for plot in ("r1_stationarity", "r1_pareto", "r1_dispersion", "r2_tfirm", "r2_critic_floors",
                 "r3_lambda_clients", "r3_rq1", "r3_pareto", "r3_ablations", "bytes_per_round"):
        assert (quick / "plots" / f"{plot}.png").stat().st_size > 1000


def test_same_config_and_seed_give_identical_outputs(tmp_path, monkeypatch):
    # the outputs compared are the records, summary and ledger: the plots (checked on the quick run above) are built
    # but not laid out or rendered, most of these runs' time
    unrendered(monkeypatch)
    cfg = firm.Config(
        solver=solver_checks.SolverConfig(instances=10),
        quadratic=quadratic.QuadraticConfig(seeds=3, rounds=4, betas=[0.0, 0.01, 1.0], preference_rounds=4,
                                            extras=["hetero"], three_objectives=False),
        momdp=momdp.MOMDPConfig(seeds=3, rounds=4, local_steps=2, batch=8, critic_iterations=2, critic_batch=4,
                                betas=[0.0, 0.01, 1.0], batch_sweep=[4, 8], client_sweep=[2, 8],
                                lemma3_iterations=20, lemma3_batches=[4, 8]),
        toy=toy.ToyConfig(seeds=3, clients=4, rounds=2, local_batches=1, big_clients=6, final_rounds=1))
    a, b = run_parts(cfg, tmp_path / "a"), run_parts(cfg, tmp_path / "b")
    assert (a / "metrics.jsonl").read_bytes() == (b / "metrics.jsonl").read_bytes()
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    assert (a / "ledger.csv").read_bytes() == (b / "ledger.csv").read_bytes()


@pytest.mark.parametrize("name", ["quick", "main"])
def test_configs_validate_and_main_has_five_seeds_wherever_methods_are_compared(name):
    experiment, _, cfg, smoke = load_config(config_path("firm", quick=name == "quick"))
    assert experiment == "firm" and smoke == (name == "quick")
    assert all(p.run for p in (cfg.solver, cfg.quadratic, cfg.momdp, cfg.toy))
    if name == "main":
        assert min(cfg.quadratic.seeds, cfg.momdp.seeds, cfg.toy.seeds) >= 5
        assert cfg.quadratic.sigmas == [0.5, 2.0] and cfg.toy.rq2_betas == [0.0, 0.01, 0.05, 0.5]
        assert cfg.toy.preference_ratios == [0.1, 0.5, 1.0, 2.0, 10.0] and cfg.momdp.betas == [0.0, 0.01, 0.1, 1.0]


def test_firm_beta_must_be_in_the_sweep():
    with pytest.raises(ValueError, match="firm_beta"):
        quadratic.QuadraticConfig(firm_beta=0.3)


def reps(value, n=6, spread=0.01, seed=0):
    return value + spread * np.random.default_rng(seed).standard_normal(n)


def test_r1_steering_and_bytes_on_crafted_inputs():
    cfg = quadratic.QuadraticConfig(preference_ratios=[0.1, 1.0, 10.0])
    values = {0.1: (0.4, 0.01), 1.0: (0.12, 0.12), 10.0: (0.01, 0.4)}
    runs = {f"p1/p2={r:g}": {"values": np.stack([reps(f1, seed=1), reps(f2, seed=2)], -1)[None]}
            for r, (f1, f2) in values.items()}
    assert quadratic.steering(cfg, runs)["verdict"] == "reproduced"
    runs["p1/p2=10"]["values"] = runs["p1/p2=0.1"]["values"].copy()  # steering reversed in the last pair
    assert quadratic.steering(cfg, runs)["verdict"] == "not reproduced"
    per = cfg.clients * cfg.rounds
    ledgers = {label: Traffic(payload={"up": up * per, "down": 0}) for label, up in
               (("firm beta=0.01", 80), ("fedcmoo-a", 240), ("fmol", 880))}
    assert [c["verdict"] for c in quadratic.byte_claims(cfg, ledgers, 2)] == ["reproduced"] * 3
    ledgers["fedcmoo-a"] = Traffic(payload={"up": 244 * per, "down": 0})  # 1 float too many
    assert quadratic.byte_claims(cfg, ledgers, 2)[1]["verdict"] == "not reproduced"


def test_r2_claims_on_crafted_curves():
    cfg = momdp.MOMDPConfig(betas=[0.0, 1.0])
    idx = {(0.0, "1/t"): 0, (0.0, 1.0): 1, (1.0, "1/t"): 2, (1.0, 1.0): 3}
    t = np.arange(1, 21)[:, None, None]
    falling = 0.02 / t * np.exp(0.05 * np.random.default_rng(0).standard_normal((20, 5, 4)))
    out = {"stationarity_lambda_bar": falling, "dispersion": np.ones((20, 5, 4)) * np.array([0.1, 1.0, 0.1, 1.0])}
    assert momdp.stationarity_claim(cfg, out, idx, 2)["verdict"] == "reproduced"
    assert momdp.smoothing_claim(cfg, out, idx)["verdict"] == "reproduced"
    out["stationarity_lambda_bar"] = falling[::-1]
    out["dispersion"] = out["dispersion"][..., [1, 0, 3, 2]]
    assert momdp.stationarity_claim(cfg, out, idx, 2)["verdict"] == "not reproduced"
    assert momdp.smoothing_claim(cfg, out, idx)["verdict"] == "not reproduced"


def toy_run(help_, harm, lam=0.5, rounds=4, steps=3, seeds=6, seed=0, wobble=0.0):
    rng = np.random.default_rng(seed)
    held = np.stack([reps(help_, seeds, seed=seed), reps(harm, seeds, seed=seed + 1)], -1)
    lam_help = lam + wobble * np.sign(np.sin(np.arange(rounds * steps) // steps + 0.5))[:, None, None]
    lam_help = lam_help + 0.001 * rng.standard_normal((rounds * steps, seeds, 2))
    return {"held_out": np.broadcast_to(held, (rounds + 1, seeds, 2)).copy(),
            "lambda": np.stack([lam_help, 1 - lam_help], -1), "dispersion": np.full((rounds * steps, seeds), 0.01)}


def test_r3_claims_on_crafted_runs():
    cfg = toy.ToyConfig(rounds=4, final_rounds=2, preference_ratios=[0.5, 2.0])
    main = {"firm": toy_run(0.7, 0.5), "fedcmoo-a": toy_run(0.7, 0.5, seed=3, wobble=0.05),
            "fedavg-ls": toy_run(0.6, 0.6), "p1/p2=0.5": toy_run(0.5, 0.7), "p1/p2=2": toy_run(0.8, 0.4)}
    assert [c["verdict"] for c in toy.rq1_claims(cfg, main)] == ["reproduced", "reproduced"]
    assert toy.rq3_claim(cfg, main)["verdict"] == "reproduced"
    worse = {**main, "firm": toy_run(0.7, 0.5, wobble=0.05), "fedcmoo-a": toy_run(0.8, 0.6, seed=3)}
    assert [c["verdict"] for c in toy.rq1_claims(cfg, worse)] == ["not reproduced", "not reproduced"]
    close, far = toy_run(0.701, 0.499, seed=5), toy_run(0.55, 0.5, lam=0.7, seed=6)
    verdicts = [c["verdict"] for c in toy.ablation_claims(cfg, main["firm"], {"close": close, "far": far})]
    assert verdicts == ["reproduced"] * 3 + ["not reproduced", "reproduced", "not reproduced"]


def test_r3_rq2_claims_on_crafted_runs():
    cfg = toy.ToyConfig(rounds=4, final_rounds=2, rq2_betas=[0.0, 0.05, 0.5])

    def world(disp):
        out = {}
        for b, d in disp.items():
            run = toy_run(0.7, 0.5, seed=int(100 * b))
            noise = np.exp(0.01 * np.random.default_rng(7).standard_normal(run["dispersion"].shape))
            run["dispersion"] = d * noise
            out[f"beta={b:g}"] = run
        return out

    falling = {0.0: 0.2, 0.05: 0.1, 0.5: 0.01}
    runs = {"rq2 independent": world(falling), "rq2 correlated": world(falling)}
    verdicts = [c["verdict"] for c in toy.rq2_claims(cfg, runs)]
    assert verdicts == ["reproduced", "not reproduced", "reproduced"]  # equal rewards: no Fig. 2 degradation
