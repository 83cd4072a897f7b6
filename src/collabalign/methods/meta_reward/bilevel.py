"""The bilevel program of the meta-learned reward model (spec docs/methods/meta-reward.md §3.1-3.2), for any
policy and reward model given as functions of their parameters.

Inner loop (Algorithm 1, reconstructed): D steps of gradient ascent θ_{t+1} = θ_t + α ∇_θ F(θ_t, φ; b_t) on the
reward-weighted log-likelihood F = mean_i w_i(φ) log π_θ(y_i|x_i) - λ/2 ‖θ‖², w_i = exp(r_φ(x_i, y_i) / β).
Outer loss: ℓ_PL(θ_D) = -mean_m log σ(log π(y_m|x_m) - log π(y'_m|x_m)) on preference pairs.
Hypergradient: reverse mode through the D steps (the corrected Proposition 1). Each step back is one double
backward of s = <∇_θ F(θ_t, φ), v>: ∇_θ s = H_t v (a Hessian-vector product) moves v back a step and ∇_φ s is that
step's contribution to ∂ℓ_PL/∂φ. Only θ_0..θ_D are stored, never an unrolled graph, so memory is O(D dim θ) and
time grows linearly in D. Replicates that share nothing (seeds, folds) can ride in one call: F and ℓ_PL summed over
them give every replicate its own gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Params = Sequence[Tensor]
InnerObjective = Callable[[Params, Params, Any], Tensor]  # (θ, φ, inner batch) -> scalar F
OuterLoss = Callable[[Params, Any], Tensor]  # (θ, outer batch) -> scalar ℓ_PL


def reward_weights(rewards: Tensor, beta: float, norm: str = "none", bound: float | None = None) -> Tensor:
    """w = exp(r / β) (spec Eq. 10), optionally with the reward bounded as c·tanh(r / c) and the weights
    self-normalised over the batch ("batch": w / mean w); the paper's default is unnormalised and unbounded."""
    if not beta > 0:
        raise ValueError(f"β must be > 0, got {beta}")
    if norm not in ("none", "batch"):
        raise ValueError(f"weight norm must be 'none' or 'batch', got {norm!r}")
    r = bound * torch.tanh(rewards / bound) if bound else rewards
    if norm == "batch":  # exp(r/β) / mean exp(r/β), as a softmax: no overflow once r/β passes float32's 88.7
        return torch.softmax(r / beta, -1) * r.shape[-1]
    return torch.exp(r / beta)


def pl_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """Eq. 7: -log σ(log π(y|x) - log π(y'|x)) per pair, from sequence log-probs (unnormalised, as in the paper)."""
    return -torch.nn.functional.logsigmoid(chosen - rejected)


@dataclass
class Hypergradient:
    """∂ℓ_PL/∂φ (one tensor per φ tensor), the outer loss at θ_D and the final inner parameters."""

    grad: list[Tensor]
    loss: float
    theta: list[Tensor]


def _leaves(params: Params) -> list[Tensor]:
    return [p.detach().requires_grad_(True) for p in params]


def inner_loop(objective: InnerObjective, theta0: Params, phi: Params, batches: Sequence[Any],
               alpha: float) -> list[list[Tensor]]:
    """θ_0 .. θ_D (detached) of D = len(batches) ascent steps on F with φ fixed."""
    if not batches:
        raise ValueError("the inner loop needs D >= 1 batches")
    phi = [p.detach() for p in phi]
    thetas = [[t.detach().clone() for t in theta0]]
    for batch in batches:
        theta = _leaves(thetas[-1])
        grads = torch.autograd.grad(objective(theta, phi, batch), theta)
        thetas.append([(t + alpha * g).detach() for t, g in zip(theta, grads, strict=True)])
    return thetas


def hypergradient(objective: InnerObjective, outer: OuterLoss, theta0: Params, phi: Params,
                  batches: Sequence[Any], pairs: Any, alpha: float, first_order: bool = False) -> Hypergradient:
    """dℓ_PL(θ_D(φ))/dφ by reverse mode through the inner loop. `first_order` drops the Hessian terms (v stays
    ∇_θ ℓ_PL(θ_D)), the cheap approximation of spec §3.2 (non-zero because φ enters through the weights)."""
    thetas = inner_loop(objective, theta0, phi, batches, alpha)
    theta_d = _leaves(thetas[-1])
    loss = outer(theta_d, pairs)
    v = list(torch.autograd.grad(loss, theta_d))
    phi_leaves = _leaves(phi)
    grad = [torch.zeros_like(p) for p in phi_leaves]
    for t in reversed(range(len(batches))):
        theta = _leaves(thetas[t])
        grads = torch.autograd.grad(objective(theta, phi_leaves, batches[t]), theta, create_graph=True)
        s = sum((g * u).sum() for g, u in zip(grads, v, strict=True))
        wrt = phi_leaves if first_order else [*phi_leaves, *theta]
        back = torch.autograd.grad(s, wrt, allow_unused=True)
        for i, b in enumerate(back[:len(grad)]):
            if b is not None:
                grad[i] += alpha * b
        if not first_order:
            v = [u + alpha * (h if h is not None else 0.0) for u, h in zip(v, back[len(grad):], strict=True)]
    return Hypergradient(grad, float(loss.detach()), [t.detach() for t in theta_d])


def finite_difference(objective: InnerObjective, outer: OuterLoss, theta0: Params, phi: Params,
                      batches: Sequence[Any], pairs: Any, alpha: float, eps: float = 1e-5) -> list[Tensor]:
    """Central finite differences of ℓ_PL(θ_D(φ)) in every coordinate of φ (the test's reference; use float64)."""

    def value(p: list[Tensor]) -> float:
        theta_d = inner_loop(objective, theta0, p, batches, alpha)[-1]
        with torch.no_grad():
            return float(outer(theta_d, pairs))

    base = [p.detach().clone() for p in phi]
    out = []
    for i, p in enumerate(base):
        g = torch.zeros_like(p)
        flat = g.view(-1)
        for j in range(p.numel()):
            plus = [q.clone() for q in base]
            minus = [q.clone() for q in base]
            plus[i].view(-1)[j] += eps
            minus[i].view(-1)[j] -= eps
            flat[j] = (value(plus) - value(minus)) / (2 * eps)
        out.append(g)
    return out
