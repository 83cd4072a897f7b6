"""AffPCL and its baselines: unbiased correction, limiting cases, agreement with the per-agent loops, determinism."""

import numpy as np
import pytest

from collabalign.methods.affpcl import METHODS, GaussianSystems, importance_weights
from collabalign.methods.affpcl.algorithm import run_affpcl
from collabalign.methods.affpcl.baselines import (
    _sampled_loss,
    run_ditto,
    run_fedavg,
    run_finetune,
    run_ifca,
    run_il,
    run_pfedme,
)
from collabalign.methods.affpcl.reference import reference_affpcl, reference_fedavg, reference_il
from collabalign.methods.affpcl.stats import last_mse


def _correction_draws(weights: str, draws: int = 50000):
    """Monte Carlo draws of (1/n) sum_j rho^i(s^j) g^{c->j}(x^c) - g^{c->i}(x^c) and of the full direction."""
    rng = np.random.default_rng(0)
    system = GaussianSystems(rng, 1, 5, delta_env=0.3, delta_obj=0.3).tile(draws)
    x, xc, th = (np.broadcast_to(rng.standard_normal(5), (draws, 5)) for _ in range(3))
    s = system.sample(rng.standard_normal((draws, 5, 5)))
    corr = system.a_mul(s, xc) - system.phi_mul(s, th)
    rho = importance_weights(system, s, weights, np.zeros_like(s), 0)
    bias = np.einsum("rij,rjd->rid", rho, corr) / 5 - corr
    direction = system.a_mul(s, x) - system.b(s) + bias
    return system, x[0], bias, direction


def test_bias_correction_is_unbiased_with_exact_ratios():
    system, x, bias, direction = _correction_draws("exact")
    se = bias.std(0) / np.sqrt(bias.shape[0])
    assert (np.abs(bias.mean(0)) < 4.5 * se).all()
    expected = np.einsum("nkl,l->nk", system.abar[0], x) - system.bbar[0]
    assert (np.abs(direction.mean(0) - expected) < 4.5 * direction.std(0) / np.sqrt(bias.shape[0])).all()


def test_without_importance_weights_the_correction_is_biased_under_environment_shift():
    _, _, bias, _ = _correction_draws("none")
    se = bias.std(0) / np.sqrt(bias.shape[0])
    assert (np.abs(bias.mean(0)) > 10 * se).any()


@pytest.mark.parametrize("method,reference,options", [
    (run_il, reference_il, {}), (run_fedavg, reference_fedavg, {}), (run_affpcl, reference_affpcl, {}),
    (run_affpcl, reference_affpcl, {"cdl": "22-2", "weights": "estimated"}),
    (run_affpcl, reference_affpcl, {"weights": "none"})])
def test_vectorised_equals_per_agent_reference(method, reference, options):
    system = GaussianSystems(np.random.default_rng(1), 2, 4, delta_env=0.5, delta_obj=0.5)
    fast = method(system, 15, 0.01, np.random.default_rng(7), **options)
    slow = reference(system, 15, 0.01, np.random.default_rng(7), **options)
    assert fast.shape == (15, 2, 4)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=1e-13)


def test_affpcl_with_one_agent_is_independent_learning():
    system = GaussianSystems(np.random.default_rng(2), 3, 1, delta_obj=0.5)
    np.testing.assert_allclose(run_affpcl(system, 40, 0.01, np.random.default_rng(3)),
                               run_il(system, 40, 0.01, np.random.default_rng(3)), rtol=1e-9)


@pytest.mark.parametrize("central,cdl", [("coe", "22-1"), ("coe", "22-2"), ("oracle", "22-1")])
def test_affpcl_gets_fedavg_rate_in_the_homogeneous_setting(central, cdl):
    system = GaussianSystems(np.random.default_rng(4), 8, 20)
    affpcl = lambda *args: run_affpcl(*args, central=central, cdl=cdl)
    last = {m: last_mse(f(system, 60, 0.01, np.random.default_rng(5))).mean()
            for m, f in (("il", run_il), ("fedavg", run_fedavg), ("affpcl", affpcl))}
    assert 0.6 < last["affpcl"] / last["fedavg"] < 1.6
    assert last["affpcl"] / last["il"] < 0.2  # collaboration gain: ~1/n asymptotically, here n = 20


def test_regularised_and_fine_tuned_baselines_reduce_to_their_parts():
    system = GaussianSystems(np.random.default_rng(6), 2, 5, delta_env=0.3, delta_obj=0.3)
    il = run_il(system, 20, 0.01, np.random.default_rng(8))
    np.testing.assert_allclose(run_ditto(system, 20, 0.01, np.random.default_rng(8), reg=0.0), il)
    np.testing.assert_allclose(run_pfedme(system, 20, 0.01, np.random.default_rng(8), reg=0.0), il)
    fed = run_fedavg(system, 20, 0.01, np.random.default_rng(8))
    np.testing.assert_array_equal(run_finetune(system, 20, 0.01, np.random.default_rng(8))[:10], fed[:10])


def test_ifca_sampled_loss_scores_every_cluster():
    system = GaussianSystems(np.random.default_rng(9), 2, 3, delta_env=0.5, delta_obj=0.5)
    recent = system.sample(np.random.default_rng(10).standard_normal((4, 2, 3, 5)))
    w = np.random.default_rng(11).standard_normal((2, 6, 5))
    loss = _sampled_loss(system, recent, w)
    a = lambda r, s: (np.eye(5) + np.outer(s, s)) @ system.a_base[r]
    phi = lambda r, s: (np.eye(5) + 0.5 * np.outer(s, s)) @ system.phi_base[r]
    for r in range(2):
        for i in range(3):
            for k in range(6):
                res = [a(r, s) @ w[r, k] - phi(r, s) @ system.theta[r, i] for s in recent[:, r, i]]
                assert loss[r, i, k] == pytest.approx(np.mean([v @ v for v in res]))
    err = run_ifca(system, 10, 0.01, np.random.default_rng(12), clusters=6, assign="sampled")
    assert np.isfinite(err).all()


def test_same_seed_same_errors_for_every_method():
    system = GaussianSystems(np.random.default_rng(13), 2, 4, delta_env=0.3, delta_obj=0.3)
    for f in METHODS.values():
        a, b = f(system, 10, 0.01, np.random.default_rng(14)), f(system, 10, 0.01, np.random.default_rng(14))
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, f(system, 10, 0.01, np.random.default_rng(15)))


def test_improvement_is_percent_reduction_and_nan_when_twice_worse():
    from collabalign.methods.affpcl.sweeps import improvement

    out = improvement(np.array([1.0, 1.0, 1.0]), np.array([0.25, 1.5, 2.5]))
    assert out[0] == 75 and out[1] == -50 and np.isnan(out[2])
