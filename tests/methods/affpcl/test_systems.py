"""Gaussian linear systems: closed-form references against Monte Carlo, density ratios, diagnostics."""

import numpy as np
import pytest

from collabalign.methods.affpcl.systems import GaussianSystems, heterogeneity, noise_alignment, tv_gaussians


@pytest.fixture(scope="module")
def system():
    return GaussianSystems(np.random.default_rng(0), runs=3, n=6, delta_env=0.3, delta_obj=0.3)


def test_closed_form_means_match_monte_carlo(system):
    mc = system.tile(40000)
    s = mc.sample_from(np.random.default_rng(1).standard_normal((40000, 6, 5)))
    x = np.random.default_rng(2).standard_normal(5)
    abar_x = mc.a_mul(s, np.broadcast_to(x, (40000, 5))).mean(0)
    b = mc.b(s)
    assert np.allclose(abar_x, system.abar[0] @ x, rtol=0.03, atol=0.3)
    assert np.allclose(b.mean(0), system.bbar[0], rtol=0.03, atol=0.1)
    assert np.allclose(np.einsum("nkl,nl->nk", system.abar[0], system.xstar[0]), system.bbar[0])


def test_matrix_free_products_equal_explicit_matrices(system):
    s = system.sample_from(np.random.default_rng(3).standard_normal((3, 6, 5)))
    x = np.random.default_rng(4).standard_normal((3, 6, 5))
    a = (np.eye(5) + s[..., :, None] * s[..., None, :]) @ system.a_base[:, None]
    assert np.allclose(system.a_mul(s, x), np.einsum("rnkl,rnl->rnk", a, x))
    assert np.allclose(system.a_mul(s, x[:, 0]), np.einsum("rnkl,rl->rnk", a, x[:, 0]))


def test_central_system_and_reference_agent(system):
    assert np.allclose(system.abar.mean(1) @ system.x_c[..., None], system.bbar.mean(1)[..., None])
    assert np.allclose(system.means[:, 0], 0) and np.allclose(np.linalg.norm(system.theta[:, 0], axis=-1), 1)
    assert (system.lambda_min_sym(system.abar) > 0).all()
    # environment heterogeneity: the average of personal solutions is not the central solution (§2.2)
    assert not np.allclose(system.xstar.mean(1), system.x_c)


def test_density_ratios_average_to_one_and_are_bounded_by_n(system):
    s = system.sample_from(np.random.default_rng(5).standard_normal((3, 6, 5)))
    rho = system.rho(s)
    assert np.allclose(rho.sum(1), 6) and (rho <= 6 + 1e-9).all() and (rho > 0).all()
    rho_direct = np.exp(system.log_density(s))
    assert np.allclose(rho, rho_direct / rho_direct.mean(1, keepdims=True))


def test_heterogeneity_diagnostics():
    rng = np.random.default_rng(6)
    homo = heterogeneity(GaussianSystems(rng, 2, 5), rng)
    assert np.allclose(homo["delta_env_tv"], 0) and np.allclose(homo["delta_cen_i"], 0, atol=1e-12)
    het = GaussianSystems(rng, 2, 5, delta_env=0.8, delta_obj=0.8)
    diag = heterogeneity(het, rng)
    assert (diag["delta_env_tv"] > 0.9).all() and (diag["delta_cen_i"] <= 1).all()
    assert tv_gaussians(np.array([4.0]))[0] == pytest.approx(0.9545, abs=1e-4)
    nu = noise_alignment(het, rng, samples=200)
    assert (nu >= 1).all() and (nu < 3).all()  # Example 7: multiplicative noise keeps nu near 1
