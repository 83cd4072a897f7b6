"""claims.py: hand-computed intervals and every rule's edge cases (n < 3, ties, zero variance, lower is better, margins,
Holm's step-down over cells)."""

import math

import numpy as np
import pytest
from scipy import stats

from collabalign import claims
from collabalign.claims import equivalence, exact, in_band, interval, non_inferiority, not_run, slopes, superiority

# t quantiles by hand from tables: t_{0.975, 2} = 4.302653, t_{0.975, 4} = 2.776445
T2, T4 = 4.302653, 2.776445


def test_t_interval_matches_hand_computation():
    iv = interval([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3)
    assert iv.method == "t" and iv.n == 3
    assert iv.estimate == pytest.approx(2.0)
    assert (iv.low, iv.high) == pytest.approx((2 - T2 / math.sqrt(3), 2 + T2 / math.sqrt(3)), abs=1e-5)
    iv = interval([1.0, 2.0, 3.0, 4.0, 5.0])  # mean 3, sd sqrt(2.5), se sqrt(0.5)
    assert (iv.low, iv.high) == pytest.approx((3 - T4 * math.sqrt(0.5), 3 + T4 * math.sqrt(0.5)), abs=1e-5)


def test_zero_variance_interval_is_the_point():
    iv = interval([0.3] * 5)
    assert (iv.low, iv.estimate, iv.high) == pytest.approx((0.3, 0.3, 0.3))


def test_bootstrap_from_twenty_replicates_is_deterministic_and_near_t():
    v = np.random.default_rng(1).normal(1.0, 2.0, size=40)
    a, b = interval(v), interval(v)
    assert a.method == "bootstrap" and a == b
    se = v.std(ddof=1) / math.sqrt(40)
    assert a.low == pytest.approx(v.mean() - 1.96 * se, abs=0.25 * se)
    assert a.high == pytest.approx(v.mean() + 1.96 * se, abs=0.25 * se)


def test_single_replicate_has_no_interval_and_non_finite_is_refused():
    assert math.isnan(interval([2.0]).low)
    with pytest.raises(ValueError):
        interval([1.0, float("nan"), 2.0])


def test_superiority_rule():
    c = superiority("A > B", "A above B")
    b = np.zeros(3)
    assert c.decide([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])["verdict"] == "inconclusive"  # low end -0.48
    assert c.decide([2.0, 3.0, 4.0], b)["verdict"] == "reproduced"  # [0.52, 5.48]
    assert c.decide([-2.0, -3.0, -4.0], b)["verdict"] == "not reproduced"
    rec = c.decide([2.0, 3.0, 4.0], b)
    assert rec["n"] == 3 and rec["estimate"] == 3.0 and rec["rule"] == "superiority" and rec["post_hoc"] is False
    assert rec["interval"] == pytest.approx([3 - T2 / math.sqrt(3), 3 + T2 / math.sqrt(3)], abs=1e-4)


def test_ties_never_confirm():
    c = superiority("A > B", "")
    assert c.decide([0.5] * 5, [0.5] * 5)["verdict"] == "inconclusive"
    assert c.decide([0.5, 0.6, 0.4], [0.5, 0.6, 0.4])["verdict"] == "inconclusive"
    # with a declared smallest effect, an exact tie refutes the claim
    assert superiority("A > B", "", smallest_effect=0.01).decide([0.5] * 5, [0.5] * 5)["verdict"] == "not reproduced"


def test_smallest_effect_separates_small_from_unclear():
    small = [0.10, 0.11, 0.09, 0.10, 0.10]  # [0.090, 0.110]
    assert superiority("", "").decide(small)["verdict"] == "reproduced"
    assert superiority("", "", smallest_effect=0.5).decide([-0.1, 0.1, 0.0, 0.05, -0.05])["verdict"] == \
        "not reproduced"
    assert superiority("", "").decide([-0.1, 0.1, 0.0, 0.05, -0.05])["verdict"] == "inconclusive"


def test_fewer_than_three_replicates_is_always_inconclusive():
    for rule in (superiority("", ""), non_inferiority("", "", 0.1), equivalence("", "", 0.1), in_band("", "", -1, 1)):
        assert rule.decide([5.0, 5.0])["verdict"] == "inconclusive"
        assert rule.decide([5.0])["interval"] is None


def test_lower_is_better_mirrors_the_direction():
    c = superiority("A has lower error", "", lower_is_better=True)
    assert c.decide([1.0, 1.1, 0.9], [2.0, 2.2, 1.9])["verdict"] == "reproduced"
    assert c.decide([2.0, 2.2, 1.9], [1.0, 1.1, 0.9])["verdict"] == "not reproduced"


def test_non_inferiority_needs_a_margin_and_is_one_sided():
    with pytest.raises(ValueError):
        non_inferiority("", "", margin=0.0)
    c = non_inferiority("A never worse than B", "", margin=0.5)
    b = np.zeros(3)
    assert c.decide([0.0, 0.0, 0.0], b)["verdict"] == "reproduced"  # a tie is within the margin
    assert c.decide([5.0, 6.0, 7.0], b)["verdict"] == "reproduced"  # far better also passes (one-sided)
    assert c.decide([-2.0, -3.0, -4.0], b)["verdict"] == "not reproduced"
    assert c.decide([-0.5, 0.5, -1.0], b)["verdict"] == "inconclusive"
    assert c.decide([0.0, 0.0, 0.0], b)["margin"] == 0.5


def test_equivalence_is_two_sided():
    c = equivalence("A ~ B", "", margin=0.5)
    assert c.decide([0.1, -0.1, 0.0, 0.05, -0.05])["verdict"] == "reproduced"
    assert c.decide([2.0, 2.1, 1.9])["verdict"] == "not reproduced"
    assert c.decide([-2.0, -2.1, -1.9])["verdict"] == "not reproduced"
    assert c.decide([0.0, 1.0, 0.5])["verdict"] == "inconclusive"


def test_ratio_scale_uses_log_ratios_and_ratio_margins():
    # AffPCL's "never worse than IL": MSE ratio at most 1.1 (margin 0.1), errors lower is better
    c = non_inferiority("AffPCL never worse than IL", "", margin=0.1, scale="ratio", lower_is_better=True)
    il = np.array([1.0, 2.0, 4.0])
    rec = c.decide(0.52 * il, il)
    assert rec["verdict"] == "reproduced" and rec["estimate"] == pytest.approx(0.52)
    assert rec["interval"] == pytest.approx([0.52, 0.52])
    assert c.decide(1.5 * il, il)["verdict"] == "not reproduced"
    with pytest.raises(ValueError):
        c.decide([1.0, -1.0, 1.0], il)


def test_band_rule_for_slopes_fitted_per_seed():
    x = np.array([1.0, 2.0, 4.0, 8.0])
    y = np.stack([3 * x ** -0.5, 2 * x ** -0.55, 5 * x ** -0.45])
    s = slopes(x, y)
    assert s == pytest.approx([-0.5, -0.55, -0.45])
    c = in_band("rate", "slope in [-0.75, -0.25]", -0.75, -0.25)
    assert c.decide(s)["verdict"] == "reproduced"
    assert in_band("", "", 0.0, 1.0).decide(s)["verdict"] == "not reproduced"
    assert in_band("", "", -0.5, 0.0).decide(s)["verdict"] == "inconclusive"
    assert slopes([1, 2, 3], [[1, 3, 5]], log_x=False, log_y=False) == pytest.approx([2.0])
    own_x = [[1, 2, 3], [0, 1, 2]]  # each replicate with its own x
    assert slopes(own_x, [[1, 3, 5], [0, 3, 6]], log_x=False, log_y=False) == pytest.approx([2.0, 3.0])


def test_exact_rule():
    c = exact("upload is B bytes", "ledger up bytes = size of B")
    assert c.decide(4096, 4096)["verdict"] == "reproduced"
    assert c.decide(4097, 4096)["verdict"] == "not reproduced"
    assert exact("", "", tolerance=1e-6).decide(1.0 + 1e-9, 1.0)["verdict"] == "reproduced"


def test_every_cell_with_holm():
    strong = [1.0, 1.1, 0.9, 1.05, 0.95]
    weak = [0.2, -0.1, 0.3, 0.1, 0.0]
    c = superiority("best in every cell", "")
    zeros = np.zeros(5)
    assert c.decide_cells({"a": (strong, zeros), "b": (strong, zeros)})["verdict"] == "reproduced"
    rec = c.decide_cells({"a": (strong, zeros), "b": (weak, zeros)})
    assert rec["verdict"] == "inconclusive" and rec["worst_cell"] == "b"
    assert rec["holm"] == {"confirmed": 1, "refuted": 0, "cells": 2}
    bad = [-1.0, -1.1, -0.9, -1.05, -0.95]
    assert c.decide_cells({"a": (strong, zeros), "b": (bad, zeros)})["verdict"] == "not reproduced"


def test_holm_is_stricter_than_one_cell():
    # significant alone (t = 3.2 on 4 df: one-sided p ~ 0.016 < 0.025), not once Holm halves the level for 2 cells
    v = np.array([0.3, 0.25, 0.0, 0.3, 0.1])
    c = superiority("", "")
    assert c.decide(v)["verdict"] == "reproduced"
    twin = {"a": (v, np.zeros(5)), "b": (v, np.zeros(5))}
    assert c.decide_cells(twin)["verdict"] == "inconclusive"


def test_non_inferiority_in_every_cell_with_ties():
    c = non_inferiority("never worse anywhere", "", margin=0.05)
    tie = np.full(5, 0.7)
    assert c.decide_cells({"x": (tie, tie), "y": (tie + 0.1, tie)})["verdict"] == "reproduced"
    with pytest.raises(ValueError):
        equivalence("", "", 0.1).decide_cells({"x": (tie, tie)})


def test_not_run_record_and_verdicts_are_known():
    rec = not_run(superiority("A > B", ""), "part switched off")
    assert rec["verdict"] == "inconclusive" and rec["n"] == 0 and rec["measured"] == {"not_run": "part switched off"}
    assert set(claims.VERDICTS) == {"reproduced", "not reproduced", "inconclusive"}


def test_record_is_json_ready():
    import json

    rec = superiority("", "").decide(np.array([1.0, 2.0, 3.0]), 0.0, arm_means={"a": np.float32(2.0)},
                                     counts=np.array([1, 2]))
    json.dumps(rec, allow_nan=False)
    for key in ("rule", "n", "estimate", "interval", "margin", "post_hoc"):
        assert key in rec


# Ratio x1.6 between the declared x1.5 margin (log 0.405) and exp(0.5) = x1.65 (log 0.5): the verdict tells
# whether the margin 0.5 was applied as log(1.5) or raw on the log scale.
BASE = np.array([1.0, 2.0, 4.0, 3.0, 5.0])
NEAR_X16 = np.array([1.59, 1.595, 1.6, 1.605, 1.61])
SPREAD = np.exp([-0.05, 0.05, 0.2, 0.35, 0.45])  # interval of the ratio about [0.946, 1.578]


@pytest.mark.parametrize(("claim", "ratios", "verdict"), [
    (non_inferiority("x1.5 worse at most", "", margin=0.5, scale="ratio", lower_is_better=True), NEAR_X16,
     "not reproduced"),
    (equivalence("within x1.5", "", margin=0.5, scale="ratio"), NEAR_X16, "not reproduced"),
    (superiority("x1.5 faster", "", smallest_effect=0.5, scale="ratio"), SPREAD, "inconclusive"),
])
def test_a_ratio_margin_is_a_factor_not_a_log_difference(claim, ratios, verdict):
    assert claim.decide(ratios * BASE, BASE)["verdict"] == verdict


def test_a_ratio_margin_is_a_factor_in_every_cell_too():
    c = non_inferiority("x1.5 worse at most", "", margin=0.5, scale="ratio", lower_is_better=True)
    rec = c.decide_cells({"a": (NEAR_X16 * BASE, BASE), "b": (NEAR_X16[::-1] * BASE, BASE)})
    assert rec["verdict"] == "not reproduced" and rec["holm"]["refuted"] == 2 and rec["margin"] == 0.5


def t_interval(d: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The two-sided t-interval of the mean of `d`, computed here independently of claims.py."""
    half = stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean() - half, d.mean() + half


# Lower is better (errors, losses): the claim is about b - a, the record keeps a - b as measured.
@pytest.mark.parametrize(("claim", "d", "verdict"), [
    (superiority("A's error lower", "", lower_is_better=True), [-2.0, -1.0, 0.0], "inconclusive"),  # [-3.48, 1.48]
    (superiority("A's error lower", "", lower_is_better=True), [-2.0, -2.1, -1.9], "reproduced"),
    (superiority("lower by 0.5", "", smallest_effect=0.5, lower_is_better=True), [-0.1, -0.2, -0.3],
     "not reproduced"),  # a - b in [-0.45, 0.05]: the gain's upper end 0.45 is below 0.5
    (superiority("lower by 0.5", "", smallest_effect=0.5, lower_is_better=True), [-0.15, -0.3, -0.45],
     "inconclusive"),  # [-0.67, 0.07]: the gain may reach 0.67
    (non_inferiority("A's error at most B's + 0.5", "", 0.5, lower_is_better=True), [0.1, 0.15, 0.2],
     "reproduced"),  # [0.03, 0.27]
    (non_inferiority("A's error at most B's + 0.5", "", 0.5, lower_is_better=True), [0.2, 0.3, 0.4],
     "inconclusive"),  # [0.05, 0.55]: straddles 0.5
    (non_inferiority("A's error at most B's + 0.5", "", 0.5, lower_is_better=True), [0.8, 0.9, 1.0],
     "not reproduced"),  # [0.65, 1.15]
], ids=["lower-unclear", "lower", "below-the-smallest-effect", "may-reach-the-smallest-effect", "within-the-margin",
        "may-pass-the-margin", "past-the-margin"])
def test_lower_is_better_interval_ends_and_verdicts(claim, d, verdict):
    b = np.array([3.0, 4.0, 5.0])
    rec = claim.decide(b + d, b)
    assert rec["verdict"] == verdict
    assert rec["estimate"] == pytest.approx(np.mean(d)) and rec["lower_is_better"] is True
    assert rec["interval"] == pytest.approx(t_interval(np.array(d)), abs=1e-5)


@pytest.mark.parametrize(("ratios", "verdict"), [
    ([0.5, 0.6, 0.7], "reproduced"),  # A's error ratio in [0.39, 0.90]: below x1.1
    ([0.9, 1.05, 1.2], "inconclusive"),  # [0.73, 1.49]
    ([1.3, 1.4, 1.5], "not reproduced"),  # wholly above x1.1
], ids=["within-the-margin", "may-pass-the-margin", "past-the-margin"])
def test_lower_is_better_on_the_ratio_scale(ratios, verdict):
    claim = non_inferiority("A's error at most x1.1 of B's", "", 0.1, scale="ratio", lower_is_better=True)
    b = np.array([2.0, 1.0, 4.0])
    rec = claim.decide(np.array(ratios) * b, b)
    low, high = t_interval(np.log(ratios))
    assert rec["verdict"] == verdict
    assert rec["estimate"] == pytest.approx(np.exp(np.mean(np.log(ratios))), rel=1e-5)
    assert rec["interval"] == pytest.approx([math.exp(low), math.exp(high)], rel=1e-5)


def test_lower_is_better_in_every_cell_orients_the_gain_and_the_worst_cell():
    zeros = np.zeros(5)
    c = superiority("lower error in every cell", "", lower_is_better=True)
    much = np.array([-1.0, -1.1, -0.9, -1.05, -0.95])
    little = much / 5  # still clearly lower, by less: the worst cell
    rec = c.decide_cells({"much": (much, zeros), "little": (little, zeros)})
    assert rec["verdict"] == "reproduced" and rec["worst_cell"] == "little"
    assert rec["estimate"] == pytest.approx(-0.2) and rec["cells"]["much"]["estimate"] == pytest.approx(-1.0)
    assert c.decide_cells({"much": (-much, zeros), "little": (little, zeros)})["verdict"] == "not reproduced"


def cell_with_p(p: float) -> np.ndarray:
    """Five replicates (sd sqrt(2.5)) whose mean's one-sided t-test against 0 has p-value `p`."""
    spread = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    return spread + stats.t.isf(p, 4) * spread.std(ddof=1) / math.sqrt(5)


# Four cells at one-sided p 0.001, 0.007, 0.015, 0.02 (names in the reverse order of p). Each step's interval at
# 1 - 0.05 / (cells left) confirms a cell when p < 0.025 / (cells left): Holm's step-down confirms d and c (0.007 <
# 0.0083) and stops at b (0.015 > 0.0125); Bonferroni (0.00625 every step) only d; no correction (0.025) all four;
# going on past b would add a (0.02 < 0.025).
HOLM_CELLS = {"a": cell_with_p(0.02), "b": cell_with_p(0.015), "c": cell_with_p(0.007), "d": cell_with_p(0.001)}


def test_holm_step_down_confirms_exactly_the_cells_before_the_first_failure():
    rec = superiority("A > B in every cell", "").decide_cells({c: (v, np.zeros(5)) for c, v in HOLM_CELLS.items()})
    assert {c for c, cell in rec["cells"].items() if cell["confirmed"]} == {"c", "d"}
    assert rec["holm"] == {"confirmed": 2, "refuted": 0, "cells": 4} and rec["verdict"] == "inconclusive"
    assert [claims.one_sided_p(HOLM_CELLS[c], 0.0) for c in "dcba"] == pytest.approx([0.001, 0.007, 0.015, 0.02])


def test_holm_checks_the_cells_in_order_of_p_at_levels_stepping_down(monkeypatch):
    checked = []

    def spy(values, level=claims.LEVEL):
        checked.append((next(c for c, v in HOLM_CELLS.items() if np.array_equal(v, values)), level))
        return interval(values, level)

    monkeypatch.setattr(claims, "interval", spy)
    assert claims._holm(HOLM_CELLS, lambda g: g, 0.0) == {"c", "d"}
    assert [c for c, _ in checked] == ["d", "c", "b"]
    assert [level for _, level in checked] == pytest.approx([1 - 0.05 / 4, 1 - 0.05 / 3, 1 - 0.05 / 2])


TIGHT = np.array([-0.02, -0.01, 0.0, 0.01, 0.02])  # narrow enough that every Holm level decides as the mean does


@pytest.mark.parametrize("lower_is_better", [False, True])
def test_a_non_inferiority_margin_is_the_boundary_of_every_cell(lower_is_better):
    sign = -1.0 if lower_is_better else 1.0  # errors: A worse means a - b above 0
    gains = {"inside": -0.4, "at": -0.5, "outside": -0.6}  # A worse than B by this much, margin 0.5
    cells = {c: (sign * (g + TIGHT), np.zeros(5)) for c, g in gains.items()}
    c = non_inferiority("A at most 0.5 worse in every cell", "", 0.5, lower_is_better=lower_is_better)
    rec = c.decide_cells(cells)
    flags = {c: (cell["confirmed"], cell["refuted"]) for c, cell in rec["cells"].items()}
    assert flags == {"inside": (True, False), "at": (False, False), "outside": (False, True)}
    assert rec["verdict"] == "not reproduced" and rec["worst_cell"] == "outside"


def test_a_smallest_effect_refutes_superiority_in_a_cell_below_it():
    c = superiority("A above B by 0.5 in every cell", "", smallest_effect=0.5)
    rec = c.decide_cells({"clear": (1.0 + TIGHT, np.zeros(5)), "tiny": (10 * TIGHT, np.zeros(5))})
    flags = {c: (cell["confirmed"], cell["refuted"]) for c, cell in rec["cells"].items()}
    assert flags == {"clear": (True, False), "tiny": (False, True)} and rec["verdict"] == "not reproduced"
    assert superiority("", "").decide_cells({"clear": (1.0 + TIGHT, 0.0), "tiny": (10 * TIGHT, 0.0)})[
        "verdict"] == "inconclusive"  # without one, a cell around 0 is unclear, not refuted
