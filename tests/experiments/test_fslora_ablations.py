"""FSLoRA's ablations E2–E5: E4's rounds scale with r/k, the upload tables, E2 with many devices and its claim."""

import numpy as np
import pytest

from collabalign.commands import CONFIG_DIR, load_config
from collabalign.experiments.fslora import ablations
from collabalign.experiments.fslora.ablations import EQUAL_BUDGET, EQUAL_BUDGET_MANY
from collabalign.experiments.fslora.config import AblationConfig, Config, FederationConfig
from collabalign.experiments.fslora.runner import devices, synthetic_problem

NOISE = np.array([0.3, -0.2, 0.1, -0.4, 0.2])  # five seeds' worth of small, mean-zero noise

TOY = Config(seeds=[0], synthetic={"n_train": 200, "n_test": 200, "extra_lrs": []},
             federation={"devices": 5, "min_size": 4, "rounds": 2, "steps": 2, "eval_every": 1},
             ablations={"budget_ranks": [8], "many_devices": None, "ratio_grid": [0.5, 1.0], "rank_grid": [4, 8, 16],
                        "fixed_k": 4, "top_k_rounds": 1})


@pytest.fixture(scope="module")
def toy_part(tmp_path_factory):
    return ablations.ablations_part(TOY, tmp_path_factory.mktemp("run"), progress=False)


@pytest.mark.parametrize(("scaled", "rounds"), [(True, [30, 60, 120, 240]), (False, [30, 30, 30, 30])])
def test_e4_runs_each_global_rank_at_device_rank_k_for_rounds_scaled_by_r_over_k(scaled, rounds):
    abl = AblationConfig(rank_grid=[8, 16, 32, 64], fixed_k=8, rank_rounds_scale=scaled)
    e4 = ablations.sweeps(FederationConfig(rounds=30), abl)[1]
    assert [arm.rounds for arm in e4.arms.values()] == rounds
    assert all(arm.method == "fslora" and arm.rank * arm.ratios[0] == 8 for arm in e4.arms.values())
    assert ("scaled by r/k" in e4.title) == scaled


def test_e2_with_many_devices_holds_only_when_sketching_wins_at_every_rank():
    assert (EQUAL_BUDGET_MANY.rule, EQUAL_BUDGET_MANY.margin, EQUAL_BUDGET_MANY.lower_is_better) == (
        EQUAL_BUDGET.rule, EQUAL_BUDGET.margin, EQUAL_BUDGET.lower_is_better)
    e2 = {r: {"sketched": 50 + gain + NOISE, "unsketched": 50 + np.roll(NOISE, 1)} for r, gain in ((4, 2), (16, 3),
                                                                                                    (64, 4))}
    record = ablations.equal_budget_claim(EQUAL_BUDGET_MANY, e2, devices=50)
    assert (record["verdict"], record["holm"]["cells"], record["measured"]["devices"]) == ("reproduced", 3, 50)
    e2[64]["sketched"] = 46 + NOISE
    record = ablations.equal_budget_claim(EQUAL_BUDGET_MANY, e2, devices=50)
    assert (record["verdict"], record["worst_cell"]) == ("not reproduced", "r=64")


def test_the_many_devices_claim_is_not_run_when_switched_off(toy_part):
    record = next(c for c in toy_part.claims if c["name"] == EQUAL_BUDGET_MANY.name)
    assert record["measured"]["not_run"] == "ablations.many_devices is null" and record["verdict"] == "inconclusive"
    assert "E2_many_devices" not in toy_part.metrics["ablations"]
    assert not any(r["variant"].startswith("N=") for r in toy_part.records)


def test_e4_records_run_the_scaled_rounds(toy_part):
    last = {}
    for r in toy_part.records:
        if r["experiment"] == "E4":
            last[r["variant"]] = max(last.get(r["variant"], 0), r["round"])
    assert last == {"r=4": 2, "r=8": 4, "r=16": 8}
    assert toy_part.claims[3]["measured"]["rounds_by_r"] == {"4": 2, "8": 4, "16": 8}


def table_rows(part, experiment: str) -> list[list[str]]:
    """The cells of the experiment's upload table in the part's notes, one list per row."""
    note = next(n for n in part.notes if n.startswith(f"{experiment}, "))
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in note.splitlines()[4:]]


def test_upload_tables_have_one_row_per_level_and_the_final_upload(toy_part):
    e4 = table_rows(toy_part, "E4")
    assert [row[:2] for row in e4] == [["4", "2"], ["8", "4"], ["16", "8"]]
    mb = [float(row[2]) for row in e4]
    assert mb[0] < mb[1] < mb[2] and mb[2] / mb[0] == pytest.approx(4, rel=0.02)  # same k: MB grows with rounds
    e3 = table_rows(toy_part, "E3")
    assert [row[:2] for row in e3] == [["0.5", "2"], ["1.0", "2"]] and float(e3[0][2]) < float(e3[1][2])
    assert len(table_rows(toy_part, "E5")) == 2
    final = {r["variant"]: r["upload_mb_per_device"] for r in toy_part.records if r["experiment"] == "E4"}
    assert mb == [pytest.approx(final[f"r={r}"], rel=1e-3) for r in (4, 8, 16)]
    metrics = toy_part.metrics["ablations"]["E4"]
    assert [metrics[f"r={r}"]["rounds"] for r in (4, 8, 16)] == [2, 4, 8]
    assert [metrics[f"r={r}"]["upload_mb_per_device"] for r in (4, 8, 16)] == pytest.approx(mb, rel=1e-3)


def test_the_main_config_runs_the_papers_ablation_settings_and_splits_its_data_over_50_devices():
    cfg = load_config(CONFIG_DIR / "fslora" / "main.yaml")[2]
    abl = cfg.ablations
    assert (abl.fixed_k, abl.rank_grid, abl.rank_rounds_scale) == (8, [8, 16, 32, 64], True)
    assert (abl.many_devices, abl.many_devices_ranks, abl.budget_ratio) == (50, [4, 16, 64], 0.5)
    assert max(abl.rank_grid + abl.many_devices_ranks) <= cfg.synthetic.dim
    fed = cfg.federation.model_copy(update={"devices": abl.many_devices})
    for seed in cfg.seeds:
        split = devices(synthetic_problem(cfg.synthetic, fed, seed, 4, cfg.synthetic.lr)[1], fed, seed)
        assert len(split) == 50 and min(len(part.y) for part in split.values()) >= fed.min_size
