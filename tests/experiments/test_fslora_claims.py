"""FSLoRA's claims are wired to claims.py as declared: rule, margin, direction, and the verdict on crafted inputs."""

import numpy as np
import pytest

from collabalign.experiments.fslora.ablations import EQUAL_BUDGET, RANK_TREND, RATIO_TREND, TOPK_RATIO_TREND, trend
from collabalign.experiments.fslora.e1_comparison import BEST_AVERAGE, decide_best_average
from collabalign.experiments.fslora.e6_timing import CHEAPER_THAN_FLEX_AND_STACK, DEVICE_TIME_AS_HETEROLORA
from collabalign.experiments.fslora.runner import METHODS
from collabalign.experiments.fslora.scores import E1Scores
from collabalign.experiments.fslora.theory import BIAS_FLOOR, FLOOR_GROWS, GAP_GROWS, RATE, SPEEDUP, fit

NOISE = np.array([0.3, -0.2, 0.1, -0.4, 0.2])  # five seeds' worth of small, mean-zero noise


def e1_with(averages: dict[str, float]) -> E1Scores:
    """E1 scores on two problems whose per-seed average is `averages[method]` + noise."""
    e1 = E1Scores()
    for i, m in enumerate(METHODS):
        base = averages[m] + np.roll(NOISE, i)
        e1.scores["synthetic", m] = list(base - 1)
        e1.scores["SST-2", m] = list(base + 1)
    return e1


def test_declared_rules_and_margins():
    assert (BEST_AVERAGE.rule, BEST_AVERAGE.margin, BEST_AVERAGE.lower_is_better) == ("superiority", 0.0, False)
    assert (DEVICE_TIME_AS_HETEROLORA.rule, DEVICE_TIME_AS_HETEROLORA.margin,
            DEVICE_TIME_AS_HETEROLORA.scale) == ("equivalence", 0.15, "ratio")
    assert (CHEAPER_THAN_FLEX_AND_STACK.rule, CHEAPER_THAN_FLEX_AND_STACK.scale,
            CHEAPER_THAN_FLEX_AND_STACK.lower_is_better) == ("superiority", "ratio", True)
    assert EQUAL_BUDGET.rule == RATIO_TREND.rule == RANK_TREND.rule == "superiority"
    assert not RATIO_TREND.lower_is_better and not RANK_TREND.lower_is_better and TOPK_RATIO_TREND.lower_is_better
    assert (RATE.rule, RATE.band) == ("band", (-0.65, -0.35))
    assert all(c.lower_is_better for c in (GAP_GROWS, SPEEDUP, BIAS_FLOOR, FLOOR_GROWS))
    assert BIAS_FLOOR.scale == "ratio"


def test_e1_tests_fslora_against_every_baseline_without_picking_a_rival():
    ahead = decide_best_average(e1_with({"fedlora": 60, "fslora": 55, "heterolora": 50, "flexlora": 52,
                                         "fedstack": 51}), ["synthetic", "SST-2"])
    assert ahead["verdict"] == "reproduced" and set(ahead["cells"]) == {"heterolora", "flexlora", "fedstack"}
    assert ahead["n"] == 5 and ahead["measured"]["problems"] == ["synthetic", "SST-2"]
    behind_one = decide_best_average(e1_with({"fedlora": 60, "fslora": 55, "heterolora": 50, "flexlora": 58,
                                              "fedstack": 51}), ["synthetic", "SST-2"])
    assert behind_one["verdict"] == "not reproduced" and behind_one["worst_cell"] == "flexlora"
    tied = decide_best_average(e1_with({"fedlora": 60, "fslora": 55, "heterolora": 50, "flexlora": 55,
                                        "fedstack": 51}), ["synthetic", "SST-2"])
    assert tied["verdict"] != "reproduced"  # a tie never confirms the ordering


def test_e2_holds_only_when_sketching_wins_at_every_rank():
    cells = {f"r={r}": (50 + gain + NOISE, 50 + np.roll(NOISE, 1)) for r, gain in ((8, 3), (32, 4))}
    assert EQUAL_BUDGET.decide_cells(cells)["verdict"] == "reproduced"
    cells["r=8"] = (45 + NOISE, 50 + np.roll(NOISE, 1))
    assert EQUAL_BUDGET.decide_cells(cells)["verdict"] == "not reproduced"


@pytest.mark.parametrize(("claim", "slope", "verdict"), [
    (RATIO_TREND, 2.0, "reproduced"), (RATIO_TREND, -2.0, "not reproduced"),
    (RANK_TREND, 2.0, "reproduced"), (RANK_TREND, 0.0, "inconclusive"),
    (TOPK_RATIO_TREND, -2.0, "reproduced"), (TOPK_RATIO_TREND, 2.0, "not reproduced")])
def test_trends_are_decided_on_a_slope_fitted_per_seed(claim, slope, verdict):
    levels = [0.125, 0.25, 0.5, 1.0]
    by_level = {x: 50 + slope * np.log(x) + NOISE * (i % 2) for i, x in enumerate(levels)}
    record = trend(claim, by_level)
    assert (record["verdict"], record["n"]) == (verdict, 5)
    assert record["estimate"] == pytest.approx(slope, abs=0.5)
    assert trend(claim, {0.5: 50 + NOISE})["measured"]["not_run"].startswith("a slope needs")


@pytest.mark.parametrize(("power", "verdict"), [(-0.5, "reproduced"), (-1.0, "not reproduced")])
def test_theory_rate_band_on_slopes_per_seed(power, verdict):
    rounds = [50, 100, 200, 400]
    values = {t: list(t ** power * np.exp(0.01 * NOISE)) for t in rounds}
    record = fit(RATE, values, rounds)
    assert record["verdict"] == verdict and record["estimate"] == pytest.approx(power, abs=0.05)
    values[400][2] = float("inf")  # a diverged run: no slope
    assert fit(RATE, values, rounds)["measured"]["not_run"].startswith("a run diverged")


@pytest.mark.parametrize(("power", "verdict"), [(-1.0, "reproduced"), (0.0, "not reproduced")])
def test_theory_speedup_is_a_slope_below_minus_0_4(power, verdict):
    devices = [2, 4, 8, 16]
    values = {n: list(n ** power * np.exp(0.01 * NOISE)) for n in devices}
    assert fit(SPEEDUP, values, devices, -0.4)["verdict"] == verdict


def test_theory_bias_floor_compares_fedlora_with_one_percent_of_each_sketched_ratio():
    fedlora = 1e-5 * np.exp(0.1 * NOISE)
    cells = {f"ratio={q}": (fedlora, 0.01 * f * np.exp(0.1 * np.roll(NOISE, 2))) for q, f in ((0.5, 0.4), (0.25, 1.0))}
    assert BIAS_FLOOR.decide_cells(cells)["verdict"] == "reproduced"
    cells["ratio=0.5"] = (fedlora, 0.01 * 1e-4 * np.exp(0.1 * np.roll(NOISE, 2)))  # FedLoRA 10x above 1% of it
    assert BIAS_FLOOR.decide_cells(cells)["verdict"] == "not reproduced"


def test_e6_device_time_equivalence_is_within_a_factor_1_15():
    hetero = 0.05 * np.exp(0.01 * NOISE)
    assert DEVICE_TIME_AS_HETEROLORA.decide(1.02 * hetero * np.exp(0.01 * np.roll(NOISE, 1)), hetero)[
        "verdict"] == "reproduced"
    assert DEVICE_TIME_AS_HETEROLORA.decide(1.5 * hetero, hetero)["verdict"] == "not reproduced"
    cheaper = CHEAPER_THAN_FLEX_AND_STACK.decide_cells({"flexlora": (hetero, 1.3 * hetero * np.exp(0.01 * NOISE)),
                                                        "fedstack": (hetero, 1.2 * hetero * np.exp(0.02 * NOISE))})
    assert cheaper["verdict"] == "reproduced"
