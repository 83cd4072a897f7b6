"""FIRM's regularised MGDA solver (spec §3.0 properties, §8 R0): the three solvers agree with each other and with a
brute-force simplex grid, the invariances and monotonicity, the limits, Lemma 8, batching and bad input."""

import numpy as np
import pytest

from collabalign.experiments.firm.solver_checks import SolverConfig, instances, lemma8, vertex_flip
from collabalign.methods.firm.solver import gram, normalise, projected_gradient, qp, regularised, solve


def random_grams(M: int, n: int = 60, d: int = 10, seed: int = 0) -> np.ndarray:
    return gram(instances(np.random.default_rng(seed), n, d, M))


@pytest.mark.parametrize("M", [2, 3, 5])
@pytest.mark.parametrize("beta", [0.0, 0.01, 0.1, 1.0])
def test_solvers_agree_to_1e_8(M, beta):
    G = random_grams(M, seed=M)
    active = solve(G, beta=beta, method="active")
    assert np.abs(solve(G, beta=beta, method="pgd") - active).max() < 1e-8
    if M == 2:
        assert np.abs(solve(G, beta=beta, method="closed") - active).max() < 1e-8
    assert np.allclose(active.sum(-1), 1) and (active >= 0).all()


@pytest.mark.parametrize("M,step", [(2, 1e-4), (3, 1 / 400)])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_solution_matches_a_brute_force_simplex_grid(M, step, beta):
    n = int(round(1 / step))
    if M == 2:
        grid = np.stack([np.arange(n + 1), n - np.arange(n + 1)], 1) / n
    else:
        i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        keep = i + j <= n
        grid = np.stack([i[keep], j[keep], n - i[keep] - j[keep]], 1) / n
    for G in random_grams(M, n=8, seed=3):
        H = regularised(G, beta)
        values = np.einsum("ki,ij,kj->k", grid, H, grid)
        lam = solve(G, beta=beta)
        assert lam @ H @ lam <= values.min() + 1e-12
        if beta > 0:  # strongly convex: the grid's minimiser is near the solution
            assert np.abs(grid[values.argmin()] - lam).max() < 5 * step + 0.02 * (M == 3)


def test_beta_zero_ignores_scale_sign_and_normalisation():
    A = instances(np.random.default_rng(1), 50, 10, 3)
    ref = solve(gram(A), beta=0.0, normalize=False)
    for other in (gram(1e-3 * A), gram(7 * A), gram(-A)):
        assert np.abs(solve(other, beta=0.0, normalize=False) - ref).max() < 1e-8
    assert np.abs(solve(gram(A), beta=0.0, normalize=True) - ref).max() < 1e-8


def test_trace_normalisation_makes_the_diagonal_average_one():
    G = random_grams(4)
    assert np.allclose(np.trace(normalise(G), axis1=-2, axis2=-1) / 4, 1.0)
    assert np.array_equal(normalise(np.zeros((3, 3))), np.zeros((3, 3)))


def test_raising_p1_raises_lambda1_and_uniform_p_is_beta_two():
    G = random_grams(3)
    lam1 = np.stack([solve(G, p=(p1, 1.0, 0.5))[:, 0] for p1 in np.geomspace(0.05, 20, 15)])
    assert (np.diff(lam1, axis=0) >= -1e-10).all() and (lam1[-1] - lam1[0]).min() > 0.01
    assert np.allclose(solve(G, p=(1.0, 1.0, 1.0)), solve(G, beta=2.0))


def test_large_beta_gives_uniform_weights_and_beta_matters_most_for_collinear_gradients():
    for M in (2, 3, 5):
        assert np.abs(solve(random_grams(M), beta=1e8) - 1 / M).max() < 1e-6
    conflict = gram(np.array([[1.0, -0.8], [0.0, 0.6]]))  # strongly conflicting: β = 0.01 barely moves λ
    assert np.abs(solve(conflict, beta=0.01) - solve(conflict, beta=0.0)).max() < 0.01
    flip = vertex_flip()
    assert flip["beta=0"] == pytest.approx(np.sqrt(2)) and flip["beta=0.01"] < 0.2


def test_lemma8_bound_holds_on_random_instances():
    out = lemma8(SolverConfig(instances=100), np.random.default_rng(4))
    assert out["violations"] == 0
    assert all(v["worst_ratio_op"] <= 1 for k, v in out.items() if k != "violations")


def test_degenerate_inputs_identical_and_zero_gradients():
    g = np.ones((5, 1)) @ np.ones((1, 2))  # two identical gradients
    assert np.allclose(solve(gram(g), beta=0.0), [0.5, 0.5])
    assert np.allclose(solve(np.zeros((2, 2)), beta=0.0), [0.5, 0.5])
    assert np.allclose(solve(np.zeros((3, 3)), beta=0.0), 1 / 3)
    assert np.allclose(solve(np.ones((1, 1)), beta=0.0), [1.0])
    low_rank = gram(np.random.default_rng(2).standard_normal((30, 2, 5)))  # β = 0, singular G: objective matches
    a, p = solve(low_rank, beta=0.0, method="active"), solve(low_rank, beta=0.0, method="pgd")
    H = regularised(low_rank, 0.0)
    assert np.abs(np.einsum("ni,nij,nj->n", a, H, a) - np.einsum("ni,nij,nj->n", p, H, p)).max() < 1e-10


def test_batches_of_any_leading_shape():
    G = random_grams(3, n=24).reshape(2, 4, 3, 3, 3)
    lam = solve(G, beta=0.1)
    assert lam.shape == (2, 4, 3, 3)
    assert np.allclose(lam[1, 2, 0], solve(G[1, 2, 0], beta=0.1))
    assert projected_gradient(regularised(G, 0.1)).shape == lam.shape
    assert qp(regularised(G[..., :2, :2], 0.1)).shape == (2, 4, 3, 2)


@pytest.mark.parametrize("kwargs,message", [
    ({"beta": -0.1}, "beta must be a finite number >= 0"),
    ({"beta": float("nan")}, "beta must be a finite number >= 0"),
    ({"p": (1.0, 2.0, 3.0)}, "preference vector p has 3 entries; expected M = 2"),
    ({"p": (1.0, 0.0)}, r"p\[1\] = 0.0 must be positive and finite"),
    ({"p": (float("inf"), 1.0)}, r"p\[0\] = inf must be positive and finite"),
    ({"p": (-1.0, 1.0)}, r"p\[0\] = -1.0 must be positive and finite"),
    ({"method": "newton"}, "method must be auto, closed, active or pgd"),
])
def test_bad_input_gives_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        solve(np.eye(2), **kwargs)


def test_bad_gram_matrices_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        solve(np.ones((2, 3)))
    with pytest.raises(ValueError, match="non-finite"):
        solve(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="closed form is for M = 2"):
        solve(np.eye(3), method="closed")
