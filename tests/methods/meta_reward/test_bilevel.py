"""The bilevel program of the meta-learned reward model on a small log-linear problem (spec §7.5): the reverse-mode
hypergradient against central finite differences in float64, the first-order approximation, the printed Eq. 13
(which must fail), replicates batched in one call, bad β and D, and Appendix A's reward-weighted regression on a
tabular policy (spec §3.4)."""

import pytest
import torch

from collabalign.experiments.meta_reward.problems.bandit import paper_eq13
from collabalign.methods.meta_reward.bilevel import (
    finite_difference,
    hypergradient,
    inner_loop,
    pl_loss,
    reward_weights,
)

F64 = torch.float64
D, B_IN, B_OUT, V, PROMPTS = 20, 32, 32, 8, 50
ALPHA, BETA, LAM = 0.3, 1.0, 1e-2


def objective(theta, phi, batch):
    """Σ over leading replicate dims of mean_i w_i log π_θ(y_i|x_i) - λ/2 ‖θ‖², log-linear π, linear reward."""
    psi, y, f = batch
    lp = torch.log_softmax(torch.einsum("...bvd,...d->...bv", psi, theta[0]), -1)
    chosen = torch.take_along_dim(lp, y[..., None], -1)[..., 0]
    w = reward_weights(torch.einsum("...bd,...d->...b", f, phi[0]), BETA)
    return (w * chosen).mean(-1).sum() - LAM / 2 * (theta[0] ** 2).sum()


def outer(theta, pairs):
    psi, chosen, rejected = pairs
    lp = torch.log_softmax(torch.einsum("...bvd,...d->...bv", psi, theta[0]), -1)
    pick = lambda y: torch.take_along_dim(lp, y[..., None], -1)[..., 0]  # noqa: E731
    return pl_loss(pick(chosen), pick(rejected)).mean(-1).sum()


def problem(seed, d_theta=60, d_phi=12, shared=False):
    """Policy features ψ (dθ) and reward features f (dφ) of V candidates per prompt; `shared`: ψ = f (dθ = dφ)."""
    g = torch.Generator().manual_seed(seed)
    f_all = torch.randn(PROMPTS, V, d_phi, generator=g, dtype=F64)
    psi_all = f_all if shared else 0.4 * torch.randn(PROMPTS, V, d_theta, generator=g, dtype=F64)
    theta0 = [0.2 * torch.randn(psi_all.shape[-1], generator=g, dtype=F64)]
    phi = [0.3 * torch.randn(d_phi, generator=g, dtype=F64)]
    batches = []
    for _ in range(D):
        x, y = torch.randint(PROMPTS, (B_IN,), generator=g), torch.randint(V, (B_IN,), generator=g)
        batches.append((psi_all[x], y, f_all[x, y]))
    x = torch.randint(PROMPTS, (B_OUT,), generator=g)
    y = torch.randint(V, (B_OUT,), generator=g)
    y2 = (y + torch.randint(1, V, (B_OUT,), generator=g)) % V
    return theta0, phi, batches, (psi_all[x], y, y2)


def test_hypergradient_matches_central_finite_differences():
    theta0, phi, batches, pairs = problem(0)
    g = hypergradient(objective, outer, theta0, phi, batches, pairs, ALPHA).grad[0]
    fd = finite_difference(objective, outer, theta0, phi, batches, pairs, ALPHA, eps=1e-5)[0]
    assert g.shape == (12,) and g.abs().max() > 1e-3
    assert (g - fd).abs().max() <= 1e-7 * g.abs().max()


def test_first_order_differs_from_exact_but_is_not_zero():
    theta0, phi, batches, pairs = problem(1)
    exact = hypergradient(objective, outer, theta0, phi, batches, pairs, ALPHA).grad[0]
    first = hypergradient(objective, outer, theta0, phi, batches, pairs, ALPHA, first_order=True).grad[0]
    assert first.abs().max() > 1e-3 * exact.abs().max()
    assert (first - exact).abs().max() > 1e-2 * exact.abs().max()


def test_printed_eq13_is_a_theta_space_vector_and_fails_the_finite_difference_test():
    theta0, phi, batches, pairs = problem(2)
    printed = paper_eq13(theta0[0], phi[0], batches, pairs, ALPHA, BETA, LAM)
    assert printed.shape == (60,)  # θ-space: not even a φ-gradient (dφ = 12)
    theta0, phi, batches, pairs = problem(3, shared=True)  # ψ = f: dθ = dφ, so the two can be compared
    printed = paper_eq13(theta0[0], phi[0], batches, pairs, ALPHA, BETA, LAM)
    fd = finite_difference(objective, outer, theta0, phi, batches, pairs, ALPHA, eps=1e-5)[0]
    exact = hypergradient(objective, outer, theta0, phi, batches, pairs, ALPHA).grad[0]
    assert (exact - fd).abs().max() <= 1e-7 * fd.abs().max()  # the corrected rule passes on the same instance
    assert (printed - fd).abs().max() > 0.5 * fd.abs().max()


def test_replicates_batched_in_one_call_get_their_own_gradients():
    a, b = problem(4), problem(5)
    separate = [hypergradient(objective, outer, *p[:3], p[3], ALPHA) for p in (a, b)]
    stack = lambda x, y: torch.stack([x, y])  # noqa: E731
    theta0 = [stack(a[0][0], b[0][0])]
    phi = [stack(a[1][0], b[1][0])]
    batches = [tuple(stack(u, v) for u, v in zip(ba, bb, strict=True)) for ba, bb in zip(a[2], b[2], strict=True)]
    pairs = tuple(stack(u, v) for u, v in zip(a[3], b[3], strict=True))
    together = hypergradient(objective, outer, theta0, phi, batches, pairs, ALPHA)
    for i, one in enumerate(separate):
        assert torch.allclose(together.grad[0][i], one.grad[0], rtol=1e-12, atol=1e-14)
        assert torch.allclose(together.theta[0][i], one.theta[0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("beta", [0.0, -1.0])
def test_nonpositive_beta_is_rejected(beta):
    with pytest.raises(ValueError, match="β must be > 0"):
        reward_weights(torch.zeros(3, dtype=F64), beta)
    theta0, phi, batches, pairs = problem(6, shared=True)
    with pytest.raises(ValueError, match="β must be > 0"):
        paper_eq13(theta0[0], phi[0], batches, pairs, ALPHA, beta)


def test_an_inner_loop_needs_at_least_one_step():
    theta0, phi, _, pairs = problem(7)
    with pytest.raises(ValueError, match="D >= 1"):
        inner_loop(objective, theta0, phi, [], ALPHA)
    with pytest.raises(ValueError, match="D >= 1"):
        hypergradient(objective, outer, theta0, phi, [], pairs, ALPHA)


def tabular(prompts=6, candidates=4, samples=5, seed=0):
    """Counts of `samples` responses per prompt (every candidate sampled at least once), rewards and μ̂."""
    g = torch.Generator().manual_seed(seed)
    counts = 1.0 + torch.stack([torch.bincount(torch.randint(candidates, (samples - candidates,), generator=g),
                                               minlength=candidates) for _ in range(prompts)]).to(F64)
    rewards = torch.randn(prompts, candidates, generator=g, dtype=F64)
    return counts, rewards, counts / counts.sum(-1, keepdim=True)


def fit_tabular(counts, weights, steps=4000, lr=1.0):
    """Gradient descent on -Σ_(x,y)∈𝒟 w(x, y) log π(y|x) / n_x for a tabular (per-prompt logits) policy."""
    logits = torch.zeros_like(counts)
    target = counts * weights
    for _ in range(steps):
        logits.requires_grad_(True)
        loss = -(target * torch.log_softmax(logits, -1)).sum(-1) / counts.sum(-1)
        (g,) = torch.autograd.grad(loss.sum(), logits)
        logits = (logits - lr * g).detach()
    return torch.softmax(logits, -1)


def test_appendix_a_rwr_with_per_prompt_normalised_weights_reaches_the_tilted_sampling_distribution():
    counts, rewards, mu = tabular()
    beta = 0.7
    w = torch.exp(rewards / beta)
    Z = (mu * w).sum(-1, keepdim=True)
    optimum = mu * w / Z  # Eq. 28
    assert torch.allclose(optimum.sum(-1), torch.ones(len(counts), dtype=F64))
    assert (fit_tabular(counts, w / Z) - optimum).abs().max() <= 1e-6
    # the paper drops 1/Z(x): with a tabular policy this re-weights prompts but keeps every prompt's optimum
    assert (fit_tabular(counts, w) - optimum).abs().max() <= 1e-6
    # and the optimum maximises the KL-regularised objective (Eq. 8) against random policies
    def rl(pi):
        return ((pi * rewards).sum(-1) - beta * (pi * (pi.log() - mu.log())).sum(-1)).sum()

    others = torch.distributions.Dirichlet(torch.ones_like(mu)).sample((200,))
    assert all(rl(optimum) >= rl(p) for p in others)


def test_appendix_a_with_one_response_per_prompt_the_reward_has_no_effect():
    g = torch.Generator().manual_seed(1)
    counts = torch.nn.functional.one_hot(torch.randint(4, (6,), generator=g), 4).to(F64)  # μ̂ = a point mass
    fits = []
    for seed in (2, 3):
        rewards = 3 * torch.randn(6, 4, generator=torch.Generator().manual_seed(seed), dtype=F64)
        w = torch.exp(rewards)
        Z = (counts * w).sum(-1, keepdim=True)
        assert torch.allclose(counts * w / Z, counts)  # Eq. 28: π* = μ̂ whatever the reward
        fits.append(fit_tabular(counts, w / Z, steps=300))
    assert torch.equal(fits[0], fits[1])  # the normalised weights are all 1: identical training
    assert ((fits[0] * counts).sum(-1) > 0.99).all()  # heading for the point mass


def test_batch_normalised_weights_stay_finite_where_exp_overflows():
    rewards = torch.tensor([[9.0, 10.0, 11.0], [0.1, 0.2, 0.3]])  # r / β up to 110 at β = 0.1: exp overflows float32
    w = reward_weights(rewards, 0.1, "batch")
    assert torch.isfinite(w).all() and torch.allclose(w.mean(-1), torch.ones(2))
    small = reward_weights(rewards[1:], 0.1, "batch")[0]
    direct = torch.exp(rewards[1] / 0.1) / torch.exp(rewards[1] / 0.1).mean()
    assert torch.allclose(small, direct)
