"""AffPCL in RL and on the digits substitute: exact stationary density ratios, personalised TD(0) limits, vectorised
RL against the per-agent loops, and the digits users' sampling and test MSE."""

import numpy as np
import pytest

from collabalign.methods.affpcl.digits import DIGITS_METHODS, DigitFeatures, DigitsUsers, run_digits
from collabalign.methods.affpcl.rl import (
    SARSA_METHODS,
    TD_METHODS,
    TabularChains,
    TabularMDPs,
    categorical,
    run_sarsa,
    run_td,
)
from collabalign.methods.affpcl.rl_reference import reference_sarsa, reference_td


@pytest.fixture(scope="module")
def chains():
    return TabularChains(np.random.default_rng(3), 2, 3, states=4, delta_env=0.6, delta_obj=0.6)


def test_stationary_distributions_and_density_ratios_are_exact(chains):
    pi, p = chains.pi, chains.p
    assert np.allclose(np.einsum("rns,rnst->rnt", pi, p), pi, atol=1e-12) and np.allclose(pi.sum(-1), 1)
    assert (pi > 0).all() and np.allclose(chains.mu.sum(-1), 1)
    mu0 = chains.mu.mean(1)
    assert np.allclose(np.einsum("rk,rnk->rn", mu0, chains.rho), 1.0)  # E_{mu^0} rho^i = 1
    assert np.allclose(chains.rho.mean(1), 1.0) and (chains.rho <= chains.n + 1e-12).all()
    assert chains.rho.std() > 0.05  # heterogeneous chains: the ratios are not trivially 1


def test_density_ratios_match_a_simulated_markov_chain(chains):
    """Transition frequencies along one long trajectory per agent (run 0) against mu^i and rho^i."""
    rng = np.random.default_rng(0)
    steps, size, n = 60000, chains.states, chains.n
    cum = np.cumsum(chains.p[0], -1)  # (n, S, S)
    o = np.zeros(n, dtype=int)
    freq = np.zeros((n, size * size))
    u = rng.uniform(size=(steps, n))
    for t in range(steps):
        o2 = categorical(cum[np.arange(n), o], u[t])
        freq[np.arange(n), o * size + o2] += 1
        o = o2
    freq /= steps
    assert np.abs(freq - chains.mu[0]).max() < 0.01
    rho_hat = freq / freq.mean(0)
    assert np.abs(rho_hat - chains.rho[0]).max() < 0.15
    # a wrong stationary law (uniform states) is detected at this sample size
    wrong = (np.full(size, 1 / size)[None, :, None] * chains.p[0]).reshape(n, -1)
    assert np.abs(freq - wrong).max() > 0.02


def test_mdp_stationary_state_action_laws_are_invariant():
    mdps = TabularMDPs(np.random.default_rng(1), 2, 3, states=4, actions=3, d=5, delta_env=0.5, delta_obj=0.5,
                       sweeps=200)
    d_sa = mdps.d_sa
    assert d_sa.shape == (2, 3, 4, 3) and np.allclose(d_sa.sum((-1, -2)), 1) and (d_sa > 0).all()
    state = d_sa.sum(-1)  # next-state law under P must equal the state marginal
    assert np.allclose(np.einsum("rnsa,rnsat->rnt", d_sa, mdps.p), state)
    assert np.allclose(np.einsum("rsa,rnsa->rn", d_sa.mean(1), mdps.rho_true), 1, atol=1e-6)


@pytest.mark.parametrize("central", ["coe", "oracle"])
def test_personalised_td_with_one_agent_is_plain_td(central):
    one = TabularChains(np.random.default_rng(5), 3, 1, states=5, delta_env=0.4, delta_obj=0.4)
    plain = run_td("il", one, 200, 0.1, np.random.default_rng(9))
    personal = run_td("affpcl", one, 200, 0.1, np.random.default_rng(9), central=central)
    assert np.allclose(personal, plain, rtol=1e-9, atol=1e-12) and plain[-1].mean() < plain[0].mean()


@pytest.mark.parametrize("features", ["tabular", "linear"])
@pytest.mark.parametrize("method", [*TD_METHODS, "oracle"])
def test_vectorised_td_equals_per_agent_loop(method, features):
    small = TabularChains(np.random.default_rng(2), 2, 3, states=4, delta_env=0.5, delta_obj=0.5, features=features,
                          d=3)
    name, central = ("affpcl", "oracle") if method == "oracle" else (method, "coe")
    fast = run_td(name, small, 40, 0.2, np.random.default_rng(4), central=central)
    slow = reference_td(name, small, 40, 0.2, np.random.default_rng(4), central=central)
    assert np.allclose(fast, slow, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", SARSA_METHODS)
def test_vectorised_sarsa_equals_per_agent_loop(method):
    mdps = TabularMDPs(np.random.default_rng(6), 2, 3, states=4, actions=3, d=5, delta_env=0.5, delta_obj=0.5,
                       sweeps=200)
    fast = run_sarsa(method, mdps, 30, 0.1, np.random.default_rng(8))
    slow = reference_sarsa(method, mdps, 30, 0.1, np.random.default_rng(8))
    assert np.allclose(fast, slow, rtol=1e-9, atol=1e-12)


def test_personalised_td_gains_about_one_over_n_on_identical_chains():
    same = TabularChains(np.random.default_rng(7), 4, 10, states=6)
    il = run_td("il", same, 1500, 0.1, np.random.default_rng(1))[-300:].mean()
    aff = run_td("affpcl", same, 1500, 0.1, np.random.default_rng(2))[-300:].mean()
    assert 0.03 < aff / il < 0.3


@pytest.fixture(scope="module")
def feats():
    return DigitFeatures(0, max_iter=60)


def test_digits_users_sample_their_class_mixtures_and_test_mse_is_exact(feats):
    users = DigitsUsers(feats, np.random.default_rng(0), 2, 4, delta_obj=0.6)
    cls, phi = users.sample(np.random.default_rng(1).uniform(size=(2, 4, 20000, 2)))
    freq = np.stack([(cls == c).mean(-1) for c in range(10)], -1)
    assert np.abs(freq - users.p).max() < 0.015
    rows = [np.flatnonzero((feats.phi == row).all(-1)) for row in phi[1, 2, :50]]
    assert all(feats.labels[r[0]] == c for r, c in zip(rows, cls[1, 2, :50], strict=True))
    assert np.allclose(np.einsum("rc,rnc->rn", users.p.mean(1), users.rho), 1.0)  # E_{mu^0} rho^i = 1
    x = np.random.default_rng(2).standard_normal((2, 4, feats.d)) * 0.1
    weights = users.p[..., feats.test_labels] / np.bincount(feats.test_labels, minlength=10)[feats.test_labels]
    pred = np.einsum("kd,rnd->rnk", feats.test_phi, x)
    brute = (weights * (pred - users.y[..., feats.test_labels]) ** 2).sum(-1)
    assert np.allclose(users.test_mse(x), brute)


def test_digits_affpcl_with_one_user_is_independent_learning(feats):
    one = DigitsUsers(feats, np.random.default_rng(0), 2, 1, delta_obj=0.0)
    il = run_digits("il", one, 30, 1.0, 4, np.random.default_rng(3))
    for method in ("affpcl", "affpcl_no_ic"):
        assert np.allclose(run_digits(method, one, 30, 1.0, 4, np.random.default_rng(3)), il)
    with pytest.raises(ValueError):
        run_digits("nope", one, 1, 1.0, 1, np.random.default_rng(0), eval_every=1)
    assert set(DIGITS_METHODS) >= {"il", "fedavg", "affpcl"}
