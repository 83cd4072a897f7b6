"""The bandit part of the meta-reward reproduction: a quick config runs in seconds, decides every declared claim in
every setting with its numbers, reports every method's metrics and the chosen β, is deterministic, and rejects bad
configs."""

import json

import pytest

from collabalign.claims import Claim
from collabalign.experiments.meta_reward import bandit
from collabalign.experiments.meta_reward.bandit import CLAIMS, BanditConfig, part
from collabalign.runs import RunDir
from collabalign.seeding import Seeds

VERDICTS = {"reproduced", "not reproduced", "inconclusive"}
KEYS = {"name", "expected", "verdict", "rule", "n", "estimate", "interval", "margin", "post_hoc", "measured"}
QUICK = {"seeds": 3, "folds": [0, 2], "outer_steps": 10, "eval_every": 5, "test_steps": 40, "baseline_steps": 60,
         "test_prompts": 100, "sft_steps": 150, "inner_steps": 10}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    cfg = BanditConfig(**QUICK)
    run = RunDir(tmp_path_factory.mktemp("bandit"))
    result = part(cfg, Seeds(0), run, progress=False)
    run.write_parts([result])
    return cfg, result, run


def test_every_declared_claim_is_decided_in_every_setting(quick):
    cfg, result, _ = quick
    assert {c.name for c in CLAIMS} == {v.name for v in vars(bandit).values() if isinstance(v, Claim)}
    for claim in CLAIMS:
        assert any(c["name"].endswith(claim.name) for c in result.claims), claim.name
    for c in result.claims:
        assert KEYS <= set(c) and c["verdict"] in VERDICTS
        assert not c["post_hoc"]
    # per s_h and protocol (2 shared β + tuned): claim 1 (s_h = 0 only), 2, five of claim 3, 4; claims 5-6 per s_h; 7
    assert len(result.claims) == 3 * 8 + 2 + 3 * 7 + 2 + 1
    headline = [c for c in result.claims if c["name"].endswith(bandit.OURS_OVER_ALL.name)]
    assert len(headline) == 6 and all(len(c["cells"]) == 2 * len(bandit.BASELINES) for c in headline)
    check = next(c for c in result.claims if c["name"].endswith(bandit.HYPERGRADIENT.name))
    assert check["verdict"] == "reproduced" and check["estimate"] <= 1e-6


def test_metrics_cover_every_method_protocol_and_note(quick):
    cfg, result, run = quick
    table = result.metrics["bandit"]["table"]
    for sh in ("s_h=0", "s_h=1"):
        for protocol in ("β=1", "β=4", "tuned β"):
            methods = table[sh][protocol]
            assert {"ours", "ours (matched)", "oracle RWR", *bandit.BASELINES} <= set(methods)
            for entry in methods.values():
                assert 0 <= entry["apl"] <= 1 and 0 <= entry["win"] <= 1
                assert {"reward@0.25", "reward@0.5", "reward@0.75", "reward@1"} <= set(entry)
        chosen = table[sh]["tuned_beta"]
        assert "SFT" not in chosen and "HPL" not in chosen
        assert all(b in cfg.beta_grid for per in chosen["ours"].values() for b in per)
    rms = result.metrics["bandit"]["reward_models"]
    assert set(rms["ours"]["s_h=0"]) == {"β=0.1", "β=1", "β=2", "β=4", "β=8"} and rms["bt"]["norm"] > 0
    note = result.notes[0]
    assert "Chance A_PL is 0.5" in note and "SFT's held-out A_PL" in note
    summary = json.loads((run.path / "summary.json").read_text())
    assert len(summary["claims"]) == len(result.claims)
    assert any(r.get("kind") == "meta_training" for r in run.read_metrics())


def test_the_part_is_deterministic(quick):
    cfg, result, _ = quick
    again = part(cfg, Seeds(0), RunDir(quick[2].path / "again"), progress=False)
    assert again.claims == result.claims and again.records == result.records


def test_a_single_beta_grid_leaves_the_sweep_claims_not_run(tmp_path):
    cfg = BanditConfig(**{**QUICK, "folds": [1], "sh_values": [0], "beta_grid": [1.0], "shared_betas": [1.0],
                          "outer_steps": 2})
    result = part(cfg, Seeds(0), RunDir(tmp_path), progress=False)
    sweep = [c for c in result.claims if c["name"].endswith((bandit.LARGER_BETA.name, bandit.RESCALES.name))]
    assert len(sweep) == 2 and all(c["measured"].get("not_run") for c in sweep)


@pytest.mark.parametrize("bad", [{"folds": [4]}, {"folds": [0, 0]}, {"folds": []}, {"sh_values": [2]},
                                 {"shared_betas": [0.0]}, {"beta_grid": [-1.0]}, {"temperatures": [0.0]},
                                 {"test_steps": 5, "inner_steps": 10}, {"seeds": 0}, {"unknown": 1}])
def test_bad_configs_are_rejected(bad):
    with pytest.raises(ValueError):
        BanditConfig(**bad)
