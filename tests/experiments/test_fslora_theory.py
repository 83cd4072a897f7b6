"""FSLoRA theory (spec fslora.md §7.4-7.5): sketch moments, Lemma 3.2, the §7.4 closed form, the exact ∇f^S, a
fast version of the rate check C2, and the theory claims on crafted checks."""

import numpy as np
import pytest
import torch

from collabalign.claims import slopes
from collabalign.experiments.fslora.sketched_regression import (
    MatrixRegression,
    _fslora_round,
    sketch_diagonals,
    sketched_loss_closed_form,
    sketched_objective,
)
from collabalign.experiments.fslora.theory import RATE, rate

SIZES = [(8, 1), (8, 2), (8, 4), (8, 8), (6, 5)]


@pytest.mark.parametrize(("r", "k"), SIZES)
def test_random_k_sketch_moments_by_enumeration(r, k):
    """E[S] = I, E[S²] = (r/k) I, ‖XS‖² ≤ (r/k)²‖X‖² for every S, E‖XS‖² = (r/k)‖X‖² (Def. 3.1, Lemma D.3)."""
    sketches = np.stack([np.diag(d) for d in sketch_diagonals(r, k)])
    assert len(sketches) == len({tuple(d) for d in sketch_diagonals(r, k)})  # distinct subsets
    np.testing.assert_allclose(sketches.mean(0), np.eye(r), atol=1e-12)
    np.testing.assert_allclose((sketches @ sketches).mean(0), (r / k) * np.eye(r), atol=1e-12)
    x = np.random.default_rng(r * 10 + k).normal(size=(7, r))
    norms = np.sum((x @ sketches) ** 2, axis=(1, 2))
    assert np.all(norms <= (r / k) ** 2 * np.sum(x**2) * (1 + 1e-12))
    assert norms.mean() == pytest.approx((r / k) * np.sum(x**2), rel=1e-12)


@pytest.mark.parametrize(("r", "k"), SIZES)
def test_lemma_3_2_sketched_gradients_match_autograd(r, k):
    """∇_B ℓ(W0 + BSA) = ∇ℓ AᵀSᵀ and ∇_A = SᵀBᵀ∇ℓ, zero outside the selected columns of B / rows of A."""
    rng = np.random.default_rng(k)
    m, n, batch = 5, 6, 3
    diag = sketch_diagonals(r, k)[rng.integers(len(sketch_diagonals(r, k)))]
    w0, b, a = rng.normal(size=(m, n)), rng.normal(size=(m, r)), rng.normal(size=(r, n))
    x, y = rng.normal(size=(n, batch)), rng.normal(size=(m, batch))
    b_t, a_t = torch.tensor(b, requires_grad=True), torch.tensor(a, requires_grad=True)
    s = torch.diag(torch.tensor(diag))
    loss = 0.5 * torch.sum(((torch.tensor(w0) + b_t @ s @ a_t) @ torch.tensor(x) - torch.tensor(y)) ** 2)
    loss.backward()
    sk = np.diag(diag)
    grad_w = ((w0 + b @ sk @ a) @ x - y) @ x.T  # ∇ℓ w.r.t. the full weight
    for auto, lemma in ((b_t.grad.numpy(), grad_w @ a.T @ sk.T), (a_t.grad.numpy(), sk.T @ b.T @ grad_w)):
        assert np.linalg.norm(auto - lemma) / np.linalg.norm(lemma) < 1e-8
    unselected = diag == 0
    assert np.all(b_t.grad.numpy()[:, unselected] == 0) and np.all(a_t.grad.numpy()[unselected] == 0)
    assert np.all(b_t.grad.numpy()[:, ~unselected] != 0) and np.all(a_t.grad.numpy()[~unselected] != 0)


@pytest.mark.parametrize(("r", "k"), SIZES + [(6, 2)])
def test_closed_form_of_sketched_squared_loss_equals_enumeration(r, k):
    """§7.4: E_S ℓ(W0 + BSA) = ℓ(W0 + BA) + ½(r/k − 1)·r/(r−1)·Σ_j‖c_j − c̄‖² for one sample."""
    rng = np.random.default_rng(100 + r + k)
    m, n = 5, 6
    w0, b, a = rng.normal(size=(m, n)), rng.normal(size=(m, r)), rng.normal(size=(r, n))
    x, y = rng.normal(size=n), rng.normal(size=m)
    enumerated = np.mean([0.5 * np.sum(((w0 + b @ np.diag(d) @ a) @ x - y) ** 2) for d in sketch_diagonals(r, k)])
    assert sketched_loss_closed_form(w0, b, a, x, y, k) == pytest.approx(enumerated, abs=1e-10, rel=0)
    if k < r:  # the penalty is real: f^S ≠ f
        assert enumerated > 0.5 * np.sum(((w0 + b @ a) @ x - y) ** 2) + 1e-6


def test_exact_sketched_objective_matches_direct_sum_and_finite_differences():
    """f^S by pooled enumeration equals the per-device definition, and its gradient equals central differences."""
    problem = MatrixRegression.make(5, seed=0)
    ks, r = [8, 4, 2, 1, 3], 8
    rng = np.random.default_rng(0)
    b, a = 0.3 * rng.normal(size=(12, r)), 0.3 * rng.normal(size=(r, 12))
    value, grad_b, grad_a = sketched_objective(problem, b, a, ks)
    direct = np.mean([np.mean([0.5 * np.sum((problem.w0 + b @ np.diag(d) @ a - target) ** 2 * scale**2)
                               for d in sketch_diagonals(r, k)])
                      for k, target, scale in zip(ks, problem.targets, problem.scales, strict=True)])
    assert value == pytest.approx(direct, rel=1e-12)
    eps = 1e-6
    for param, grad in ((b, grad_b), (a, grad_a)):
        numeric = np.zeros_like(param)
        for idx in np.ndindex(param.shape):
            step = np.zeros_like(param)
            step[idx] = eps
            plus = sketched_objective(problem, *((b + step, a) if param is b else (b, a + step)), ks)[0]
            minus = sketched_objective(problem, *((b - step, a) if param is b else (b, a - step)), ks)[0]
            numeric[idx] = (plus - minus) / (2 * eps)
        assert np.linalg.norm(numeric - grad) / np.linalg.norm(grad) < 1e-7


def test_sub_block_round_equals_dense_masked_eq4_and_eq5():
    """The simulation's sub-block round equals dense SGD on the full factors with S in the forward (eq. 4) and the
    plain mean over all N devices (eq. 5); sketches are drawn as the simulation does (argsort of uniforms)."""
    problem, ks, r, lr, steps = MatrixRegression.make(4, seed=1), np.array([8, 4, 2, 4]), 8, 0.03, 3
    rng = np.random.default_rng(5)
    b, a = 0.3 * rng.normal(size=(12, r)), 0.3 * rng.normal(size=(r, 12))
    new_b, new_a = _fslora_round(problem, b, a, ks, lr, steps, np.random.default_rng(1), np.random.default_rng(2))
    sketch_rng, (x, y) = np.random.default_rng(1), problem.sample(np.random.default_rng(2), steps)
    chosen = {}
    for k in np.unique(ks):
        dev = np.flatnonzero(ks == k)
        chosen |= dict(zip(dev, np.sort(sketch_rng.random((len(dev), r)).argsort(1)[:, :k], 1), strict=True))
    ref_b, ref_a = b.copy(), a.copy()
    for i, k in enumerate(ks):
        sk = np.zeros((r, r))
        sk[chosen[i], chosen[i]] = r / k
        bi, ai = b, a
        for h in range(steps):
            grad_w = ((problem.w0 + bi @ sk @ ai) @ x[h, i].T - y[h, i].T) @ x[h, i] / problem.batch
            bi, ai = bi - lr * grad_w @ ai.T @ sk.T, ai - lr * sk.T @ bi.T @ grad_w
        ref_b, ref_a = ref_b + (bi - b) / len(ks), ref_a + (ai - a) / len(ks)
    np.testing.assert_allclose(new_b, ref_b, rtol=0, atol=1e-12)
    np.testing.assert_allclose(new_a, ref_a, rtol=0, atol=1e-12)


def test_rate_check_c2_slope_is_about_minus_one_half():
    """Cor. 4.5 with γ_T ∝ 1/√T: per seed, the slope of log (1/T)Σ‖∇f^S(X^t)‖² against log T lies in [−0.65, −0.35]."""
    rounds = (50, 200, 800)
    result = rate((0, 1), rounds)
    per_seed = np.array([result["avg_grad_sq"][t] for t in rounds]).T  # (seeds, T)
    assert np.all(np.diff(per_seed, axis=1) < 0)
    fitted = slopes(rounds, per_seed)
    assert np.all((-0.65 <= fitted) & (fitted <= -0.35)), fitted
    assert RATE.band == (-0.65, -0.35)
