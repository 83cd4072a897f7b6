"""T-FIRM on the tabular MOMDP (spec §3.3, §3.4, §8 R2): exact evaluation against finite differences, the restart
chain's stationary law, the critic converging to V^π, the actor's TD estimate of (1 − γ)∇J, and a small run."""

import numpy as np
import pytest

from collabalign.experiments.firm.problems.tfirm import (
    MOMDP,
    Critic,
    Setting,
    Variant,
    actor_gradients,
    critic_errors,
    simulate,
    softmax,
)


@pytest.fixture(scope="module")
def env():
    return MOMDP(np.random.default_rng(0), 3)


def policies(seed: int = 1, scale: float = 1.0) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal((3, 6, 3))


def test_environment_is_the_spec_instance(env):
    assert env.P.shape == (3, 6, 3, 6) and np.allclose(env.P.sum(-1), 1)
    assert env.r.shape == (3, 6, 3, 2) and env.r.min() >= 0 and env.r.max() <= 1
    assert np.corrcoef(env.r[..., 0].ravel(), env.r[..., 1].ravel())[0, 1] < -0.8  # conflicting objectives


def test_exact_gradient_matches_finite_differences(env):
    theta = policies()
    exact = env.evaluate(theta)
    eps = 1e-6
    for s, a in ((0, 0), (3, 2), (5, 1)):
        step = np.zeros_like(theta)
        step[:, s, a] = eps
        fd = (env.evaluate(theta + step)["J"] - env.evaluate(theta - step)["J"]) / (2 * eps)
        assert np.allclose(fd, exact["grad"][:, s, a], atol=1e-7)
    assert np.allclose(exact["d"].sum(-1), 1)


def test_restart_chain_visits_states_by_the_discounted_visitation(env):
    theta = policies(2)[:, None]
    states, actions, _, _, _ = env.sample(theta, np.zeros((3, 1), np.int64), 40000, np.random.default_rng(3))
    visits = np.stack([np.bincount(states[:, r, 0], minlength=6) for r in range(3)]) / 40000
    assert np.abs(visits - env.evaluate(theta[:, 0])["d"]).max() < 0.015
    pi = softmax(theta[:, 0])
    freq = np.mean(actions[:, 0, 0][states[:, 0, 0] == 0][:, None] == np.arange(3), 0)
    assert np.abs(freq - pi[0, 0]).max() < 0.03


def test_critic_converges_to_the_value_of_a_fixed_policy(env):
    errs = critic_errors(env, policies(4), Critic(iterations=400, batch=16, step=0.5), np.random.default_rng(5))
    assert errs.shape == (401, 3)
    assert (errs[-1] < 0.02 * errs[0]).all() and (errs[200] < errs[50]).all()


def test_actor_estimate_is_one_minus_gamma_times_the_gradient_with_the_true_critic(env):
    theta = policies(6, 0.5)
    exact = env.evaluate(theta)
    g, _ = actor_gradients(env, theta[:, None], exact["V"][:, None], np.zeros((3, 1), np.int64), 30000,
                           np.random.default_rng(7))
    target = (1 - env.gamma) * exact["grad"]
    assert np.abs(g[:, 0] - target).max() < 0.1 * np.abs(target).max()


def test_small_run_checks_the_lemmas_and_smoothing_cuts_dispersion(env):
    variants = [Variant(0.01, "1/t"), Variant(0.01, 1.0), Variant(1.0, 1.0, normalize=True)]
    setting = Setting(clients=3, rounds=6, local_steps=3, batch=8, critic=Critic(iterations=2, batch=8))
    out = simulate(env, variants, setting, np.random.default_rng(8))
    assert out["stationarity"].shape == (6, 3, 3) and out["J"].shape == (6, 3, 3, 2)
    assert out["lemma7_holds"].all() and out["lemma10_holds"].all()
    assert (out["lemma7_worst"] < 0.01).all() and (out["lemma10_worst"] <= 1 + 1e-12).all()
    disp = out["dispersion"].mean((0, 1))
    assert disp[0] < disp[1] and disp[2] < disp[1]
    assert (out["stationarity_lambda_bar"] >= out["stationarity"] - 1e-15).all()  # min over λ is a lower bound
    assert np.allclose(out["lambda_bar"].sum(-1), 1)


def test_variant_labels():
    assert Variant(0.1, "1/t").label == "beta=0.1 eta=1/t"
    assert Variant(0.0, 1.0, True).label == "beta=0 eta=1 norm"
