"""The regularised MGDA subproblem of FIRM (spec §3.0): λ* = argmin over the simplex of λᵀ(Ĝ + D)λ, with Ĝ the
(trace-normalised) Gram matrix of the M per-objective gradients and D = (β/2)I, or Diag(1/p) for a preference
vector p. Every function takes one (M, M) matrix or a batch (..., M, M), so many clients are solved at once.

Solvers: the closed form for M = 2, exact active-set enumeration (KKT check, pseudo-inverse for singular blocks) for
M <= 8, and accelerated projected gradient with Duchi's simplex projection for any M (the cross-check)."""

from __future__ import annotations

from itertools import combinations

import numpy as np

IDENTICAL = 1e-18  # M = 2: a denominator at or below this means identical gradients -> (1/2, 1/2)
ACTIVE_SET_MAX_M = 8


def gram(grads: np.ndarray) -> np.ndarray:
    """Gram matrices (..., M, M) in float64 of gradients stacked as columns, (..., d, M)."""
    g = np.asarray(grads, dtype=np.float64)
    return np.swapaxes(g, -1, -2) @ g


def normalise(G: np.ndarray) -> np.ndarray:
    """Ĝ = G / (tr G / M) wherever the trace is positive (the diagonal then averages 1); other matrices unchanged."""
    s = np.trace(G, axis1=-2, axis2=-1) / G.shape[-1]
    return G / np.where(s > 0, s, 1.0)[..., None, None]


def penalty(M: int, beta: float = 0.01, p=None) -> np.ndarray:
    """The diagonal of D: β/2 for every objective, or 1/p_j for a preference vector p (β is then unused)."""
    if p is None:
        if not (np.isfinite(beta) and beta >= 0):
            raise ValueError(f"beta must be a finite number >= 0, got {beta}")
        return np.full(M, beta / 2.0)
    p = np.asarray(p, dtype=np.float64).ravel()
    if p.size != M:
        raise ValueError(f"preference vector p has {p.size} entries; expected M = {M}")
    for j, v in enumerate(p):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"preference vector entry p[{j}] = {v} must be positive and finite")
    return 1.0 / p


def regularised(G: np.ndarray, beta: float = 0.01, p=None, normalize: bool = True) -> np.ndarray:
    """H = Ĝ + D (or G + D without normalisation) for one Gram matrix or a batch."""
    G = np.asarray(G, dtype=np.float64)
    if G.ndim < 2 or G.shape[-1] != G.shape[-2] or G.shape[-1] < 1:
        raise ValueError(f"Gram matrices must have shape (..., M, M), got {G.shape}")
    if not np.all(np.isfinite(G)):
        raise ValueError("Gram matrix has non-finite entries")
    d = penalty(G.shape[-1], beta, p)
    return (normalise(G) if normalize else G) + np.diag(d)


def solve(G: np.ndarray, beta: float = 0.01, p=None, normalize: bool = True, method: str = "auto") -> np.ndarray:
    """FIRM's weights λ* (..., M) for Gram matrices G (..., M, M): β = 0.01 is the paper's default; p replaces
    (β/2)I by Diag(1/p). `method`: auto (closed form for M = 2, active set up to M = 8, else pgd), closed, active,
    pgd."""
    return qp(regularised(G, beta, p, normalize), method)


def qp(H: np.ndarray, method: str = "auto") -> np.ndarray:
    """argmin over the simplex of λᵀHλ for positive semi-definite H (..., M, M)."""
    M = H.shape[-1]
    if method == "auto":
        method = "closed" if M == 2 else "active" if M <= ACTIVE_SET_MAX_M else "pgd"
    if M == 1:
        return np.ones(H.shape[:-1])
    if method == "closed":
        if M != 2:
            raise ValueError(f"the closed form is for M = 2, got M = {M}")
        return closed_form(H)
    if method == "active":
        return active_set(H)
    if method == "pgd":
        return projected_gradient(H)
    raise ValueError(f"method must be auto, closed, active or pgd, got {method!r}")


def closed_form(H: np.ndarray) -> np.ndarray:
    """M = 2: a* = clip((H22 - H12) / (H11 + H22 - 2 H12), 0, 1); (1/2, 1/2) when the denominator is <= 1e-18."""
    h11, h22, h12 = H[..., 0, 0], H[..., 1, 1], H[..., 0, 1]
    den = h11 + h22 - 2 * h12
    ok = den > IDENTICAL
    a = np.where(ok, np.clip((h22 - h12) / np.where(ok, den, 1.0), 0.0, 1.0), 0.5)
    return np.stack([a, 1 - a], -1)


def active_set(H: np.ndarray) -> np.ndarray:
    """Exact solution by enumerating supports S (largest first): the KKT system [[H_SS, -1], [1ᵀ, 0]] [λ_S; ν] =
    [0; 1] solved with a pseudo-inverse (singular H at β = 0), accepted when λ_S >= 0 and (Hλ)_i >= ν off S; among
    accepted supports the lowest objective wins (ties keep the larger support)."""
    shape, M = H.shape[:-2], H.shape[-1]
    scale = np.abs(H.reshape(-1, M, M)).max((1, 2))
    flat = H.reshape(-1, M, M) / np.where(scale > 0, scale, 1.0)[:, None, None]  # same argmin, entries <= 1
    tol = np.full(len(flat), 1e-12)
    best, best_obj = np.full((len(flat), M), 1.0 / M), np.full(len(flat), np.inf)
    spare, spare_obj = best.copy(), np.full(len(flat), np.inf)  # best primal-feasible candidate (numerical fallback)
    for size in range(M, 0, -1):
        for S in combinations(range(M), size):
            S = list(S)
            kkt = np.zeros((len(flat), size + 1, size + 1))
            kkt[:, :size, :size] = flat[:, S][:, :, S]
            kkt[:, :size, size], kkt[:, size, :size] = -1.0, 1.0
            rhs = np.zeros(size + 1)
            rhs[size] = 1.0
            sol = np.linalg.pinv(kkt) @ rhs
            lam = np.zeros((len(flat), M))
            lam[:, S] = sol[:, :size]
            hl = np.einsum("nij,nj->ni", flat, lam)
            obj = np.einsum("ni,ni->n", lam, hl)
            feasible = (lam >= -tol[:, None]).all(1) & (np.abs(lam.sum(1) - 1) < 1e-9)
            off = np.ones(M, bool)
            off[S] = False
            kkt_ok = (feasible & (np.abs(hl[:, S] - obj[:, None]) <= 1e3 * tol[:, None]).all(1)
                      & (hl[:, off] >= obj[:, None] - 1e3 * tol[:, None]).all(1))
            take = kkt_ok & (obj < best_obj - tol)
            best[take], best_obj[take] = lam[take], obj[take]
            spare_take = feasible & (obj < spare_obj - tol)
            spare[spare_take], spare_obj[spare_take] = lam[spare_take], obj[spare_take]
    out = np.where(np.isfinite(best_obj)[:, None], best, spare)
    out = np.maximum(out, 0.0)
    return (out / out.sum(1, keepdims=True)).reshape(*shape, M)


def project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of each row of v (..., M) onto the simplex (Duchi et al. 2008, sort-based)."""
    M = v.shape[-1]
    u = -np.sort(-v, axis=-1)
    css = np.cumsum(u, -1) - 1.0
    k = np.arange(1, M + 1)
    rho = M - np.argmax((u - css / k > 0)[..., ::-1], axis=-1)
    tau = np.take_along_axis(css, rho[..., None] - 1, -1) / rho[..., None]
    return np.maximum(v - tau, 0.0)


def projected_gradient(H: np.ndarray, tol: float = 1e-13, max_iter: int = 10_000) -> np.ndarray:
    """FISTA with adaptive restart on λᵀHλ over the simplex, step 1/λ_max(H), from uniform; stops when every
    gradient-mapping step ‖Π(y - Hy/λ_max) - y‖₁ is below `tol` or after `max_iter` iterations."""
    shape, M = H.shape[:-2], H.shape[-1]
    flat = H.reshape(-1, M, M)
    lmax = np.linalg.eigvalsh(flat)[:, -1]
    step = 1.0 / np.where(lmax > 0, lmax, 1.0)
    x = np.full((len(flat), M), 1.0 / M)
    y, t = x.copy(), np.ones(len(flat))
    for _ in range(max_iter):
        x_new = project_simplex(y - step[:, None] * np.einsum("nij,nj->ni", flat, y))
        if np.abs(x_new - y).sum(1).max() < tol:
            x = x_new
            break
        restart = ((y - x_new) * (x_new - x)).sum(1) > 0
        t = np.where(restart, 1.0, t)
        t_new = (1 + np.sqrt(1 + 4 * t * t)) / 2
        y = x_new + (((t - 1) / t_new) * ~restart)[:, None] * (x_new - x)
        x, t = x_new, t_new
    return x.reshape(*shape, M)
