"""The H = 1 bandit of spec §8.3 on the §8.1 ground truth, and Alg. 1 steps 2–3: the pessimistic policy.

S prompts with K candidate responses each; candidate (s, a) carries its own features (u, v), so
X_{s,a} = u v^T and r_i(s, a) = <Theta_i, X_{s,a}> = u^T Theta_i v. The comparison data (mu_0, mu_1) only cover
a fixed subset of each prompt's candidates; mu_ref is uniform over all candidates. For the Frobenius confidence set
R_i = {||Delta_i - Delta^_i||_F^2 <= zeta} the inner minimum of eq. 3.5 is closed form (spec §3.1):

    min_{r in R_i} J(pi; r) - J(mu_ref; r) = <Theta^_i, M_pi> - sqrt(zeta) ||M_pi||_F,
    M_pi = (1/S) sum_s (Phi_{pi,s} - Phi_{ref,s}),

which is concave in pi; exponentiated-gradient ascent on the per-prompt simplices maximises it. Every function is
batched over a leading "problem" dimension P (users x zeta values), prompts and candidates: no Python loop over them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from collabalign.experiments.pshare_lora.problems.synthetic import Truth, labelled
from collabalign.methods.pshare_lora.train import Prefs


@dataclass
class Bandit:
    """Candidate features u (S, K, d1) and v (S, K, d2), and which candidates the comparison data cover (S, K)."""

    u: Tensor
    v: Tensor
    covered: Tensor
    x: Tensor = field(init=False, repr=False)  # vec(X_{s,a}) = vec(u v^T), (S, K, d1 d2): every product is a matmul

    def __post_init__(self) -> None:
        self.x = (self.u[..., :, None] * self.v[..., None, :]).flatten(-2)

    @property
    def rows(self) -> Tensor:
        """Model inputs [u, v] per candidate, (S, K, d1 + d2), as `synthetic.pairs` lays them out."""
        return torch.cat([self.u, self.v], dim=-1)

    @property
    def covered_index(self) -> Tensor:
        """The covered candidates of each prompt, (S, m), in index order (every prompt covers m of them)."""
        m = int(self.covered[0].sum())
        if not bool((self.covered.sum(dim=1) == m).all()):
            raise ValueError("every prompt must cover the same number of candidates")
        return self.covered.nonzero()[:, 1].reshape(-1, m)


def make_bandit(d1: int, d2: int, prompts: int, candidates: int, coverage: float, g: torch.Generator) -> Bandit:
    """Gaussian candidate features (float64: policies are solved in double) and a random round(coverage * K), at
    least 2, covered candidates per prompt."""
    u = torch.randn(prompts, candidates, d1, generator=g, dtype=torch.float64)
    v = torch.randn(prompts, candidates, d2, generator=g, dtype=torch.float64)
    m = min(candidates, max(2, round(coverage * candidates)))
    rank = torch.rand(prompts, candidates, generator=g).argsort(dim=1).argsort(dim=1)  # a random permutation each
    return Bandit(u, v, rank < m)


def bandit_pairs(bandit: Bandit, truth: Truth, per_user: int, g: torch.Generator) -> Prefs:
    """`per_user` pairs per user (rows grouped by user): a uniform prompt, two distinct covered candidates of it
    (mu_0 = mu_1 = uniform over the covered ones, never the same twice) and o ~ Bernoulli(sigmoid(r*(tau0) -
    r*(tau1))); rows [u, v] in the truth's dtype, as `synthetic.pairs` writes them."""
    n = truth.delta.shape[0]
    idx = bandit.covered_index
    prompts, m = idx.shape
    users = torch.arange(n).repeat_interleave(per_user)
    s = torch.randint(prompts, (len(users),), generator=g)
    j0 = torch.randint(m, (len(users),), generator=g)
    j1 = (j0 + 1 + torch.randint(m - 1, (len(users),), generator=g)) % m
    rows = bandit.rows.to(truth.delta.dtype)
    return labelled(truth, users, rows[s, idx[s, j0]], rows[s, idx[s, j1]], g)


def first_pairs(data: Prefs, n_users: int, per_user: int) -> Prefs:
    """The first `per_user` pairs of every user from data grouped by user (nested data sets across N_p)."""
    total = len(data) // n_users
    if per_user > total:
        raise ValueError(f"asked for {per_user} pairs per user, the data hold {total}")
    return data[(torch.arange(n_users)[:, None] * total + torch.arange(per_user)).flatten()]


def rewards(theta: Tensor, bandit: Bandit) -> Tensor:
    """r(s, a) = u_{s,a}^T Theta_p v_{s,a} for every problem p, (P, S, K)."""
    return (theta.flatten(1) @ bandit.x.flatten(0, 1).T).unflatten(1, bandit.covered.shape)


def feature_shift(pi: Tensor, bandit: Bandit) -> Tensor:
    """M_pi = (1/S) sum_s (Phi_{pi,s} - Phi_{ref,s}) with mu_ref uniform, (P, d1, d2)."""
    w = (pi - 1.0 / pi.shape[-1]).flatten(1)
    return (w @ bandit.x.flatten(0, 1) / pi.shape[-2]).unflatten(1, bandit.u.shape[-1:] + bandit.v.shape[-1:])


def objective(theta: Tensor, bandit: Bandit, zeta: Tensor, pi: Tensor) -> Tensor:
    """The pessimistic value <Theta_p, M_pi> - sqrt(zeta_p) ||M_pi||_F per problem, (P,)."""
    m = feature_shift(pi, bandit)
    return (theta * m).sum(dim=(1, 2)) - zeta.sqrt() * m.flatten(1).norm(dim=1)


def ascent_direction(theta: Tensor, bandit: Bandit, zeta: Tensor, pi: Tensor) -> Tensor:
    """S times the (sub)gradient of the pessimistic value in pi: r_{Theta - sqrt(zeta) M / ||M||}(s, a), (P, S, K);
    at M = 0 the subgradient with zero penalty part is used."""
    m = feature_shift(pi, bandit)
    worst = theta - zeta.sqrt()[:, None, None] * m / m.flatten(1).norm(dim=1).clamp_min(1e-12)[:, None, None]
    return rewards(worst, bandit)


def frank_wolfe_gap(theta: Tensor, bandit: Bandit, zeta: Tensor, pi: Tensor) -> Tensor:
    """(1/S) sum_s [max_a g_s(a) - <pi_s, g_s>] for the ascent direction g: an upper bound on how far the
    concave objective at pi is below its maximum, (P,)."""
    g = ascent_direction(theta, bandit, zeta, pi)
    return (g.max(dim=-1).values - (pi * g).sum(dim=-1)).mean(dim=-1)


def pessimistic_policy(theta: Tensor, bandit: Bandit, zeta: Tensor, iters: int = 200,
                       step: float = 1.0) -> tuple[Tensor, Tensor]:
    """Exponentiated-gradient ascent from mu_ref on every prompt's simplex with a per-problem backtracking step
    (halved when a step would lower the objective, then regrown x1.5 up to `step`), so the objective never falls:
    ||M|| has curvature sqrt(zeta) / ||M||, which a fixed step overshoots for large zeta. Returns the policy
    (P, S, K) and the objective after every iteration (iters + 1, P). `step` is in reward units per prompt (the
    gradient times S); zeta = 0 gives the greedy policy (a softmax of the rewards at temperature 1 / (step iters))."""
    logits = torch.zeros(theta.shape[0], *bandit.covered.shape, dtype=theta.dtype)
    pi = torch.softmax(logits, dim=-1)
    val = objective(theta, bandit, zeta, pi)
    rate = torch.full_like(val, step)
    trace = [val]
    for _ in range(iters):
        trial = logits + rate[:, None, None] * ascent_direction(theta, bandit, zeta, pi)
        trial_pi = torch.softmax(trial, dim=-1)
        trial_val = objective(theta, bandit, zeta, trial_pi)
        ok = trial_val >= val
        logits = torch.where(ok[:, None, None], trial, logits)
        pi = torch.where(ok[:, None, None], trial_pi, pi)
        val = torch.where(ok, trial_val, val)
        rate = torch.where(ok, (1.5 * rate).clamp(max=step), 0.5 * rate)
        trace.append(val)
    return pi, torch.stack(trace)


def value_gap(theta_true: Tensor, bandit: Bandit, pi: Tensor) -> Tensor:
    """J(pi*; r*) - J(pi; r*) per problem, pi* the best response per prompt under the truth, (P,)."""
    r = rewards(theta_true, bandit)
    return r.max(dim=-1).values.mean(dim=-1) - (pi * r).sum(dim=-1).mean(dim=-1)


def theory_zeta(truth: Truth, k: int, n_train: int, delta: float = 0.1) -> float:
    """A (B.1)-shaped radius: 2 / N_p * (k (d1 + N d2) / (N nu) + k d2 + log(N / delta)) + min_i b_i +
    (1 / nu) sqrt(Sigma_tail / N). The constant c3 / (2 L1^2) is unknown (spec §9.13); 2 / N_p * (parameter count)
    is the asymptotic MLE squared error under BTL at margin 0 with unit-variance features (Fisher info I / 2 per
    pair). The log(N N_p / delta) factor of the bracketing number is dropped."""
    n, d1, d2 = truth.delta.shape
    s, bias = truth.spectrum(k)
    nu, tail = float(s[k - 1] ** 2 / n), float(s[k:].square().sum())
    count = k * (d1 + n * d2) / (n * nu) + k * d2 + float(torch.log(torch.tensor(n / delta)))
    return 2 * count / n_train + float(bias.min()) + (tail / n) ** 0.5 / nu
