"""AffPCL's one update rule and its baselines on the Gaussian systems: unbiased correction, limiting cases, agreement
with the per-agent loops, determinism, the step sizes each step applies."""

from dataclasses import dataclass, field

import numpy as np
import pytest

from collabalign.methods.affpcl import IFCA, IL, AffPCL, Ditto, FineTune, GaussianSystems, OneStepFedAvg, PFedMe, run
from collabalign.methods.affpcl.systems import GaussianBatch

from .reference import reference_affpcl, reference_fedavg, reference_il

METHODS = {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(), "finetune": FineTune(), "pfedme": PFedMe(),
           "ditto": Ditto(), "ifca": IFCA()}


def errors(method, system, steps=15, alpha=0.01, seed=7):
    return run(method, system, steps, alpha, np.random.default_rng(seed))[0]


def last10(err):
    return err[-10:].mean((0, 2))


def _correction_draws(weights: str, draws: int = 50000):
    """Monte Carlo draws of the importance-corrected term minus the bias correction, and of the full direction."""
    rng = np.random.default_rng(0)
    system = GaussianSystems(rng, 1, 5, delta_env=0.3, delta_obj=0.3).tile(draws)
    x, xc, th = (np.broadcast_to(rng.standard_normal(5), (draws, 5)) for _ in range(3))
    s = system.sample_from(rng.standard_normal((draws, 5, 5)))
    batch, est = GaussianBatch(s, system.b(s)), system.central_start("coe", weights)._replace(theta=th)
    corr = system.bias_correction(xc, est, batch)
    server = (system.importance_corrected(corr, xc, est, batch, None, weights) if weights != "none"
              else corr.mean(1, keepdims=True))
    bias = server - corr
    direction = system.grad(x, batch) + bias
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
    (IL(), reference_il, {}), (OneStepFedAvg(), reference_fedavg, {}), (AffPCL(), reference_affpcl, {}),
    (AffPCL(cdl="22-2", weights="estimated"), reference_affpcl, {"cdl": "22-2", "weights": "estimated"}),
    (AffPCL(weights="none"), reference_affpcl, {"weights": "none"})])
def test_vectorised_equals_per_agent_reference(method, reference, options):
    system = GaussianSystems(np.random.default_rng(1), 2, 4, delta_env=0.5, delta_obj=0.5)
    fast = errors(method, system)
    slow = reference(system, 15, 0.01, np.random.default_rng(7), **options)
    assert fast.shape == (15, 2, 4)
    np.testing.assert_allclose(fast, slow, rtol=1e-10, atol=1e-13)


def test_affpcl_with_one_agent_is_independent_learning():
    system = GaussianSystems(np.random.default_rng(2), 3, 1, delta_obj=0.5)
    np.testing.assert_allclose(errors(AffPCL(), system, 40, seed=3), errors(IL(), system, 40, seed=3), rtol=1e-9)


@pytest.mark.parametrize("central,cdl", [("coe", "22-1"), ("coe", "22-2"), ("oracle", "22-1")])
def test_affpcl_gets_fedavg_rate_in_the_homogeneous_setting(central, cdl):
    system = GaussianSystems(np.random.default_rng(4), 8, 20)
    last = {m: last10(errors(method, system, 60, seed=5)).mean()
            for m, method in (("il", IL()), ("fedavg", OneStepFedAvg()), ("affpcl", AffPCL(central=central, cdl=cdl)))}
    assert 0.6 < last["affpcl"] / last["fedavg"] < 1.6
    assert last["affpcl"] / last["il"] < 0.2  # collaboration gain: ~1/n asymptotically, here n = 20


def test_regularised_and_fine_tuned_baselines_reduce_to_their_parts():
    system = GaussianSystems(np.random.default_rng(6), 2, 5, delta_env=0.3, delta_obj=0.3)
    il = errors(IL(), system, 20, seed=8)
    np.testing.assert_allclose(errors(Ditto(reg=0.0), system, 20, seed=8), il)
    np.testing.assert_allclose(errors(PFedMe(reg=0.0), system, 20, seed=8), il)
    fed = errors(OneStepFedAvg(), system, 20, seed=8)
    tuned = errors(FineTune(), system, 20, seed=8)
    np.testing.assert_array_equal(tuned[:10], fed[:10])
    assert not np.allclose(tuned[10:], fed[10:])


def test_ifca_sampled_loss_scores_every_cluster():
    system = GaussianSystems(np.random.default_rng(9), 2, 3, delta_env=0.5, delta_obj=0.5)
    noise = np.random.default_rng(10).standard_normal((4, 2, 3, 5))
    recent = tuple(system.sample(noise, t, None) for t in range(4))
    w = np.random.default_rng(11).standard_normal((2, 6, 5))
    loss = system.cluster_loss(w, recent)
    a = lambda r, s: (np.eye(5) + np.outer(s, s)) @ system.a_base[r]
    phi = lambda r, s: (np.eye(5) + 0.5 * np.outer(s, s)) @ system.phi_base[r]
    for r in range(2):
        for i in range(3):
            for k in range(6):
                res = [a(r, b.s[r, i]) @ w[r, k] - phi(r, b.s[r, i]) @ system.theta[r, i] for b in recent]
                assert loss[r, i, k] == pytest.approx(np.mean([v @ v for v in res]))
    assert np.isfinite(errors(IFCA(clusters=6, assign="sampled"), system, 10, seed=12)).all()


def test_ifca_with_one_cluster_started_at_zero_is_fedavg():
    system = GaussianSystems(np.random.default_rng(16), 2, 3, delta_env=0.6, delta_obj=0.6)
    err = errors(IFCA(clusters=1, init_std=0.0), system, 30, seed=17)
    np.testing.assert_allclose(err, errors(OneStepFedAvg(), system, 30, seed=17), rtol=1e-10)


def test_same_seed_same_errors_for_every_method():
    system = GaussianSystems(np.random.default_rng(13), 2, 4, delta_env=0.3, delta_obj=0.3)
    for method in METHODS.values():
        a, b = errors(method, system, 10, seed=14), errors(method, system, 10, seed=14)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, errors(method, system, 10, seed=15))


def test_step_size_schedules_per_step_and_per_run():
    system = GaussianSystems(np.random.default_rng(18), 3, 4, delta_env=0.2, delta_obj=0.2)
    constant = errors(AffPCL(), system, 12, alpha=0.01)
    np.testing.assert_array_equal(errors(AffPCL(), system, 12, alpha=np.full(12, 0.01)), constant)
    np.testing.assert_array_equal(errors(AffPCL(), system, 12, alpha=np.full(3, 0.01)), constant)
    faster = errors(AffPCL(), system, 12, alpha=np.array([0.01, 0.01, 0.02]))
    np.testing.assert_array_equal(faster[:, :2], constant[:, :2])
    assert not np.allclose(faster[:, 2], constant[:, 2])


@dataclass(frozen=True)
class StepSizesSeen(AffPCL):
    """AffPCL that records the step sizes (one per run) each of its steps is given."""

    seen: list = field(default_factory=list, compare=False)

    def step(self, problem, state, batch, a, t):
        self.seen.append(a.copy())
        return super().step(problem, state, batch, a, t)


PER_STEP = np.array([0.01, 0.02, 0.03])
PER_RUN = np.array([0.04, 0.05, 0.06])
GRID = np.arange(1, 13).reshape(4, 3) / 100  # step t, run r: (3t + r + 1) / 100


@pytest.mark.parametrize(("alpha", "steps", "applied"), [
    (PER_STEP, 3, np.repeat(PER_STEP[:, None], 3, axis=1)),  # as many steps as runs: a per-step schedule
    (PER_RUN, 4, np.tile(PER_RUN, (4, 1))),
    (GRID, 4, GRID),
    (0.01, 4, np.full((4, 3), 0.01)),
], ids=["per-step", "per-run", "per-step-and-run", "constant"])
def test_each_step_applies_its_own_step_sizes(alpha, steps, applied):
    system = GaussianSystems(np.random.default_rng(18), 3, 4, delta_env=0.2, delta_obj=0.2)  # 3 runs
    method = StepSizesSeen()
    errors(method, system, steps, alpha=alpha)
    np.testing.assert_array_equal(np.stack(method.seen), applied)
