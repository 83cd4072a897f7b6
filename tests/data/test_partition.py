import numpy as np
import pytest

from collabalign.data import by_key, dirichlet, iid, label_skew

LABELS = np.random.default_rng(0).integers(0, 10, 2000)


def assert_exact_partition(parts, n_items):
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats within a client
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n_items))


def test_iid_exact_near_equal_and_deterministic():
    parts = iid(103, 10, np.random.default_rng(3))
    assert_exact_partition(parts, 103)
    assert {len(p) for p in parts} == {10, 11}
    again = iid(103, 10, np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, iid(103, 10, np.random.default_rng(4)), strict=True))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 5.0])
def test_dirichlet_exact_min_size_and_deterministic(alpha):
    parts = dirichlet(LABELS, 20, alpha, np.random.default_rng(7), min_size=15)
    assert_exact_partition(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 15
    again = dirichlet(LABELS, 20, alpha, np.random.default_rng(7), min_size=15)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_dirichlet_accepts_any_hashable_labels():
    topics = ["violence", "drugs", "other", ("tuple", 1)] * 25
    parts = dirichlet(topics, 4, 1.0, np.random.default_rng(0))
    assert_exact_partition(parts, 100)


def test_dirichlet_skew_decreases_with_alpha():
    alphas = [0.05, 0.3, 2.0, 50.0]
    skew = [
        np.mean([label_skew(dirichlet(LABELS, 10, a, np.random.default_rng(s)), LABELS) for s in range(5)])
        for a in alphas
    ]
    assert all(hi > lo for hi, lo in zip(skew, skew[1:], strict=False)), skew
    assert skew[0] > 0.5 and skew[-1] < 0.1
    assert label_skew(iid(len(LABELS), 10, np.random.default_rng(0)), LABELS) < 0.1


def test_by_key_groups_in_first_appearance_order():
    groups = by_key(["b", "a", "b", "c", "a"])
    assert list(groups) == ["b", "a", "c"]
    assert [g.tolist() for g in groups.values()] == [[0, 2], [1, 4], [3]]
    assert_exact_partition(list(by_key(LABELS).values()), len(LABELS))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rng: iid(10, 0, rng), "n_clients must be >= 1"),
        (lambda rng: iid(10, 4, rng, min_size=3), "cannot give 4 clients 3 items each from only 10 items"),
        (lambda rng: dirichlet([0, 1] * 5, 2, 0.0, rng), "alpha must be a positive"),
        (lambda rng: dirichlet([0, 1] * 5, 2, -1.0, rng), "alpha must be a positive"),
        (lambda rng: dirichlet([0, 1] * 5, 2, 1.0, rng, min_size=-1), "min_size must be >= 0"),
        (lambda rng: dirichlet([0] * 20, 10, 0.01, rng, min_size=2), "no Dirichlet\\(alpha=0.01\\) draw in 1000 tries"),
    ],
)
def test_invalid_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call(np.random.default_rng(0))
