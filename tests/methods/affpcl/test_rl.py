"""AffPCL in RL: exact stationary density ratios, personalised TD(0) limits, and the one vectorised update rule on the
TD and SARSA problems against the per-agent loops."""

import numpy as np
import pytest

from collabalign.experiments.affpcl.problems.rl import categorical
from collabalign.experiments.affpcl.problems.sarsa import TabularMDPs
from collabalign.experiments.affpcl.problems.td import TabularChains
from collabalign.methods.affpcl import IL, AffPCL, OneStepFedAvg, run

from .rl_reference import reference_sarsa, reference_td

TD = {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(), "oracle": AffPCL(central="oracle")}
SARSA = {"il": IL(), "fedavg": OneStepFedAvg(), "affpcl": AffPCL(cdl="22-2"),
         "affpcl_dre": AffPCL(cdl="22-2", weights="dre")}


def errors(method, problem, steps, alpha, seed):
    return run(method, problem, steps, alpha, np.random.default_rng(seed))[0]


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
    plain = errors(IL(), one, 200, 0.1, 9)
    personal = errors(AffPCL(central=central), one, 200, 0.1, 9)
    assert np.allclose(personal, plain, rtol=1e-9, atol=1e-12) and plain[-1].mean() < plain[0].mean()


@pytest.mark.parametrize("features", ["tabular", "linear"])
@pytest.mark.parametrize("method", list(TD))
def test_vectorised_td_equals_per_agent_loop(method, features):
    small = TabularChains(np.random.default_rng(2), 2, 3, states=4, delta_env=0.5, delta_obj=0.5, features=features,
                          d=3)
    name, central = ("affpcl", "oracle") if method == "oracle" else (method, "coe")
    fast = errors(TD[method], small, 40, 0.2, 4)
    slow = reference_td(name, small, 40, 0.2, np.random.default_rng(4), central=central)
    assert np.allclose(fast, slow, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", list(SARSA))
def test_vectorised_sarsa_equals_per_agent_loop(method):
    mdps = TabularMDPs(np.random.default_rng(6), 2, 3, states=4, actions=3, d=5, delta_env=0.5, delta_obj=0.5,
                       sweeps=200)
    fast = errors(SARSA[method], mdps, 30, 0.1, 8)
    slow = reference_sarsa(method, mdps, 30, 0.1, np.random.default_rng(8))
    assert np.allclose(fast, slow, rtol=1e-9, atol=1e-12)


def test_personalised_td_gains_about_one_over_n_on_identical_chains():
    same = TabularChains(np.random.default_rng(7), 4, 10, states=6)
    il = errors(IL(), same, 1500, 0.1, 1)[-300:].mean()
    aff = errors(AffPCL(), same, 1500, 0.1, 2)[-300:].mean()
    assert 0.03 < aff / il < 0.3


def test_sarsa_problem_rejects_an_oracle_central_reward_and_unknown_ratios():
    mdps = TabularMDPs(np.random.default_rng(6), 1, 2, states=3, actions=2, d=3, sweeps=50)
    with pytest.raises(ValueError, match="COE only"):
        errors(AffPCL(central="oracle"), mdps, 2, 0.1, 0)
    with pytest.raises(ValueError, match="unknown density ratios"):
        errors(AffPCL(cdl="22-2", weights="plugin"), mdps, 2, 0.1, 0)
