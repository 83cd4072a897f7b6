"""The §8.3 bandit: the closed-form inner minimum, the exponentiated-gradient solver, the value gap and the skewed pair
generator."""

import pytest
import torch

from collabalign.experiments.pshare_lora.problems.bandit import (
    bandit_pairs,
    feature_shift,
    first_pairs,
    frank_wolfe_gap,
    make_bandit,
    objective,
    pessimistic_policy,
    rewards,
    theory_zeta,
    value_gap,
)
from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, generate, true_reward


def random_setup(d1=32, d2=8, prompts=20, candidates=10, problems=6, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    bandit = make_bandit(d1, d2, prompts, candidates, 0.5, g)
    theta = torch.randn(problems, d1, d2, generator=g, dtype=torch.float64)
    theta = scale * theta / theta.flatten(1).norm(dim=1)[:, None, None]
    return bandit, theta, g


def test_closed_form_inner_minimum_equals_the_minimum_over_the_frobenius_ball():
    bandit, theta, g = random_setup(d1=3, d2=2, prompts=4, candidates=3, problems=1)
    pi = torch.softmax(torch.randn(1, 4, 3, generator=g, dtype=torch.float64), dim=-1)
    zeta = torch.tensor([0.7], dtype=torch.float64)
    closed = float(objective(theta, bandit, zeta, pi)[0])

    def value(deltas):  # J(pi; r) - J(mu_ref; r) for r = r_{Theta^ + Delta}, straight from the candidates' rewards
        r = rewards(theta + deltas, bandit)
        return ((pi - 1 / 3) * r).sum(dim=-1).mean(dim=-1)

    d = torch.randn(50_000, 3, 2, generator=g, dtype=torch.float64)
    radius = torch.rand(50_000, 1, 1, generator=g, dtype=torch.float64) ** (1 / 6)  # uniform in the 6-d ball
    d = d / d.flatten(1).norm(dim=1)[:, None, None] * radius
    sampled = value(zeta.sqrt() * d)
    assert float(sampled.min()) >= closed - 1e-9  # nothing in the ball goes below the closed form
    assert float(sampled.min()) <= closed + 0.02 * abs(closed)  # and dense samples come close to it
    m = feature_shift(pi, bandit)
    argmin = -zeta.sqrt() * m / m.norm()
    assert float(value(argmin)[0]) == pytest.approx(closed, abs=1e-12)  # the analytic minimiser attains it


def test_zeta_zero_gives_the_best_response_per_prompt_and_true_theta_has_no_gap():
    bandit, theta, _ = random_setup()
    pi, trace = pessimistic_policy(theta, bandit, torch.zeros(len(theta), dtype=torch.float64))
    assert torch.equal(pi.argmax(dim=-1), rewards(theta, bandit).argmax(dim=-1))
    assert float(pi.max(dim=-1).values.min()) > 0.95
    assert float((trace[1:] - trace[:-1]).min()) >= -1e-12
    greedy = torch.nn.functional.one_hot(rewards(theta, bandit).argmax(dim=-1), 10).double()
    assert float(value_gap(theta, bandit, greedy).abs().max()) < 1e-12
    assert float(value_gap(theta, bandit, pi).max()) < 1e-2  # the solver's softmax at temperature 1 / 200


@pytest.mark.parametrize("zeta", [0.0, 0.05, 0.5])
def test_solver_converges_objective_never_falls_and_the_frank_wolfe_gap_closes(zeta):
    bandit, theta, _ = random_setup()
    z = torch.full((len(theta),), zeta, dtype=torch.float64)
    pi, trace = pessimistic_policy(theta, bandit, z)
    assert float((trace[1:] - trace[:-1]).min()) >= 0.0
    assert float(trace[-1].min()) > float(trace[0].max()) + 0.5  # it moved well away from mu_ref (value 0)
    assert float(feature_shift(pi, bandit).flatten(1).norm(dim=1).min()) > 0.1  # smooth point: the gap certifies
    assert float(frank_wolfe_gap(theta, bandit, z, pi).max()) < 5e-3 * float(trace[-1].min())


def test_large_zeta_pulls_the_policy_to_mu_ref_including_on_uncovered_candidates():
    """The Frobenius ball does not know the coverage: the policy approaches mu_ref everywhere as zeta grows, so its
    mass on the uncovered candidates goes back to mu_ref's (1 - coverage)."""
    bandit, theta, _ = random_setup()
    tv, hidden = [], []
    for zeta in (0.0, 0.1, 1.0, 3.0, 1e4):
        pi, _ = pessimistic_policy(theta, bandit, torch.full((len(theta),), zeta, dtype=torch.float64))
        tv.append(float((pi - 0.1).abs().sum(dim=-1).mean() / 2))
        hidden.append(float((pi * ~bandit.covered).sum(dim=-1).mean()))
    assert all(a >= b - 1e-6 for a, b in zip(tv, tv[1:], strict=False)) and tv[0] > 0.8 and tv[-1] < 1e-9
    assert hidden[-1] == pytest.approx(0.5, abs=1e-9) and abs(hidden[0] - 0.5) > abs(hidden[-2] - 0.5)


def test_pairs_compare_two_covered_candidates_of_one_prompt_with_btl_labels():
    problem = ProblemConfig(n_test=10)
    truth, _, _ = generate(problem, 0)
    g = torch.Generator().manual_seed(1)
    bandit = make_bandit(problem.d1, problem.d2, 20, 10, 0.3, g)
    assert bool((bandit.covered.sum(dim=1) == 3).all())
    data = bandit_pairs(bandit, truth, 1500, g)
    assert torch.equal(torch.bincount(data.users), torch.full((problem.users,), 1500))
    rows = bandit.rows.float().flatten(0, 1)  # (S K, d1 + d2)

    def which(x):  # the (prompt, candidate) each row is
        hit = (x[:, None, :] == rows[None]).all(dim=-1)
        assert bool((hit.sum(dim=1) == 1).all())
        return hit.double().argmax(dim=1).div(10, rounding_mode="floor"), hit.double().argmax(dim=1) % 10

    (s0, a0), (s1, a1) = which(data.chosen), which(data.rejected)
    assert torch.equal(s0, s1) and bool((a0 != a1).all())
    assert bool(bandit.covered[s0, a0].all() and bandit.covered[s1, a1].all())
    theta = truth.theta_init + truth.delta
    diff = true_reward(theta, data.users, data.chosen) - true_reward(theta, data.users, data.rejected)
    expected = torch.sigmoid(diff.abs()).mean()  # BTL: the better one is chosen with probability sigmoid(|diff|)
    assert float((diff > 0).double().mean()) == pytest.approx(float(expected), abs=0.015)
    small = first_pairs(data, problem.users, 40)
    assert len(small) == 40 * problem.users and torch.equal(small.chosen[40:80], data.chosen[1500:1540])


def test_theory_zeta_shrinks_with_data():
    truth, _, _ = generate(ProblemConfig(n_test=10), 0)
    assert theory_zeta(truth, 2, 25) == pytest.approx(4 * theory_zeta(truth, 2, 100), rel=1e-6)  # tail ~ 0 (float32)
