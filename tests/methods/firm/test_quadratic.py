"""R1's federated quadratic and its simulation: the exact Pareto set is stationary, the λ rules behave as their
definitions say at small sizes, and the traffic counter gives each method's exact bytes."""

import numpy as np
import pytest

from collabalign.comm import Message
from collabalign.experiments.firm.problems.quadratic import Quadratic, Setting, simulate
from collabalign.methods.firm.rules import Rule, Traffic, disagreement, dispersion, stationarity

SMALL = Setting(rounds=6, local_steps=3, sigma=2.0)


def run(rule, problem=None, setting=SMALL, seed=0, traffic=None):
    return simulate(problem or Quadratic(3, clients=4), rule, setting, np.random.default_rng(seed), traffic)


@pytest.mark.parametrize("M", [2, 3])
def test_exact_pareto_set_is_pareto_stationary_with_its_weights(M):
    problem = Quadratic(2, clients=3, objectives=M, hetero=0.1, rng=np.random.default_rng(0))
    w = np.random.default_rng(1).dirichlet(np.ones(M), size=7)
    theta = problem.pareto_set(w)  # (S, 7, d)
    grads = np.stack([problem.global_grads(theta[:, k]) for k in range(7)], 1)  # (S, 7, d, M)
    assert np.abs(np.einsum("sndm,nm->snd", grads, w)).max() < 1e-12
    assert stationarity(grads).max() < 1e-15
    assert stationarity(problem.global_grads(np.broadcast_to(problem.theta0, (2, problem.d)))).min() > 0.1


def test_front_is_the_known_curve_for_the_homogeneous_problem():
    front = Quadratic(1).front(5)[0]  # θ*(w)_0 = w − 0.5, other coordinates 0: f = (½(1 − w)², ½ w²)
    w = np.linspace(0, 1, 5)
    assert np.allclose(front, np.stack([0.5 * (1 - w) ** 2, 0.5 * w**2], 1))


def test_values_and_gradients_are_consistent():
    problem = Quadratic(2, clients=3, objectives=3, hetero=0.2, rng=np.random.default_rng(2))
    theta = np.random.default_rng(3).standard_normal((2, problem.d))
    eps, g = 1e-6, problem.global_grads(theta)
    for i in (0, 1, 7):
        step = np.zeros(problem.d)
        step[i] = eps
        fd = (problem.values(theta + step) - problem.values(theta - step)) / (2 * eps)
        assert np.allclose(fd, g[:, i], atol=1e-6)


def test_fixed_and_server_weights_have_zero_dispersion():
    for kind in ("ls", "fedcmoo", "fmol"):
        out = run(Rule(kind))
        assert out["dispersion"].max() < 1e-25 and out["disagreement"].max() < 1e-25
    firm = run(Rule("firm", beta=0.0))
    assert firm["dispersion"].mean() > 1e-3 and firm["disagreement"].mean() > 0
    ls = run(Rule("ls", w=(0.8, 0.2)))
    assert np.allclose(ls["lambda"], [0.8, 0.2])


def test_large_beta_is_fedavg_with_uniform_weights_on_the_same_noise():
    firm, ls = run(Rule("firm", beta=1e9)), run(Rule("ls"))
    assert np.abs(firm["lambda"] - 0.5).max() < 1e-8
    assert np.allclose(firm["values"], ls["values"], rtol=1e-7)


def test_without_noise_homogeneous_clients_agree():
    out = run(Rule("firm", beta=0.0), setting=Setting(rounds=4, local_steps=3, sigma=0.0))
    assert out["dispersion"].max() < 1e-25 and out["model_dispersion"].max() < 1e-20


def test_noise_has_the_declared_shared_sample_correlation():
    problem = Quadratic(1, clients=2000, d=3)
    theta = np.zeros((1, 2000, 3))
    noise = problem.noisy(theta, Setting(sigma=4.0, batch=16, rho_noise=0.5), np.random.default_rng(0))
    noise = noise - problem.grads(theta)
    corr = np.corrcoef(noise[..., 0].ravel(), noise[..., 1].ravel())[0, 1]
    assert corr == pytest.approx(0.5, abs=0.03) and noise.std() == pytest.approx(1.0, rel=0.03)


def test_traffic_counts_each_methods_exact_array_bytes():
    problem, setting, d, M, C = Quadratic(2, clients=4), Setting(rounds=3, local_steps=2), 20, 2, 4
    per = {}
    for kind in ("firm", "fedcmoo", "fmol", "ls"):
        traffic = Traffic()
        run(Rule(kind), problem, setting, traffic=traffic)
        per[kind] = {k: v / (C * setting.rounds) for k, v in traffic.payload.items()}
        wire = traffic.ledger.total()
        assert wire > sum(traffic.payload.values())  # serialised bytes add the safetensors headers
    K = setting.local_steps
    assert per["firm"] == per["ls"] == {"up": 4 * d, "down": 4 * d}
    assert per["fedcmoo"] == {"up": 4 * (M + 1) * d, "down": 4 * (d + M)}
    assert per["fmol"] == {"up": 4 * (K * M + 1) * d, "down": 4 * (d + K * M)}
    msg = Message({"theta": np.zeros(d, np.float32)})
    assert Traffic().ledger.rows == [] and msg.array_nbytes == 4 * d


def test_drift_metrics_on_a_hand_example():
    lam = np.array([[1.0, 0.0], [0.0, 1.0]])  # two clients at opposite vertices
    assert dispersion(lam) == pytest.approx(0.5)
    g = np.stack([np.eye(2), np.eye(2)])  # (C, d, M): g_j = e_j for both clients
    # (1/C) Σ_c Σ_j g_j (λ^c_j − λ̄_j) = ½[(½, −½) + (−½, ½)] = 0
    assert disagreement(g, lam) == pytest.approx(0.0)
    g2 = np.stack([np.eye(2), 2 * np.eye(2)])
    assert disagreement(g2, lam) == pytest.approx(0.125)  # ½[(½, −½) + (−1, 1)] = (−¼, ¼)


def test_bad_problem_and_rule_arguments():
    with pytest.raises(ValueError, match="M = 2 or 3"):
        Quadratic(1, objectives=4)
    with pytest.raises(ValueError, match="start must be"):
        Quadratic(1, start="corner")
    with pytest.raises(ValueError, match="rule kind"):
        Rule("mgda")
    with pytest.raises(ValueError, match="fixed weights"):
        Rule("ls", w=(0.7, 0.7)).fixed(2)
