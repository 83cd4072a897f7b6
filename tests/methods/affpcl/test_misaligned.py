"""The misaligned systems of §7.2 item 8: exact references and noise alignment nu, and AffPCL's limiting case."""

import numpy as np
import pytest

from collabalign.experiments.affpcl.problems.misaligned import MisalignedSystems, SignBatch
from collabalign.methods.affpcl import IL, AffPCL, run


def test_solutions_zero_the_mean_direction_and_nu_grows_with_kappa():
    nus = []
    for kappa in (0.0, 1.0, 4.0):
        system = MisalignedSystems(np.random.default_rng(0), 3, 4, kappa, delta_obj=0.3)
        z = np.zeros((3, 4, 5))
        mean = sum(system.grad(system.xstar, SignBatch(np.full((3, 4), sign), z)) for sign in (-1.0, 1.0)) / 2
        assert np.allclose(mean, 0, atol=1e-12)  # E g^i(x^i_*) = 0 over the fair sign (and zero-mean z)
        nus.append(system.nu())
    assert np.allclose(nus[0], 1.0)  # no noise in A: D = Abar (SPD), nu = 1
    assert (nus[1] > 1.5).all() and (nus[2] > 2 * nus[1]).all()
    assert np.allclose(np.linalg.norm(system.theta[:, 0], axis=-1), 1.0)  # agent 1 holds the unit theta_base


def test_bias_correction_differs_from_the_local_direction_by_a_constant_without_noise_in_a():
    system = MisalignedSystems(np.random.default_rng(1), 2, 5, 0.0, delta_obj=0.5)
    draws = system.draw(3, np.random.default_rng(2))
    batch = system.sample(draws, 1, None)
    x = np.random.default_rng(3).standard_normal((2, 5))
    diff = system.grad(x, batch) - system.bias_correction(x, None, batch)
    assert np.allclose(diff, system.theta_c[:, None] - system.theta)  # b^i - b^c is deterministic


def test_affpcl_with_one_agent_is_independent_learning_and_needs_the_oracle():
    system = MisalignedSystems(np.random.default_rng(4), 3, 1, 2.0, delta_obj=0.0)
    il = run(IL(), system, 50, 0.005, np.random.default_rng(5))[0]
    affpcl = run(AffPCL(central="oracle", weights="none"), system, 50, 0.005, np.random.default_rng(5))[0]
    np.testing.assert_allclose(affpcl, il, rtol=1e-9)
    with pytest.raises(ValueError, match="oracle"):
        run(AffPCL(), system, 1, 0.005, np.random.default_rng(0))
