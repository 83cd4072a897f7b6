"""The model behind FSLoRA's theory checks (spec fslora.md §7.4-7.5): synthetic low-rank matrix regression in float64
numpy, the exact sketched objective f^S by enumerating every k-subset, the §7.4 closed form, and an exact sub-block
FSLoRA simulation that records f^S, its gradient and the unsketched f every round (theory.py runs the checks)."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collabalign.seeding import Seeds

DIVERGED = 1e8  # f^S above this counts as divergence (the problem starts at f^S = O(10))


@dataclass(frozen=True)
class MatrixRegression:
    """Device i: x = L_i z, y = W_i* x + noise·ε, loss ½‖Wx − y‖², W_i* = W0 + ΔW* + het·G_i/√n (§7.5)."""

    w0: np.ndarray  # (m, n) frozen weight, N(0, 1/n)
    targets: np.ndarray  # (N, m, n) W_i*
    scales: np.ndarray  # (N, n) diagonals of L_i, U[0.5, 1.5]
    noise: float
    batch: int

    @classmethod
    def make(cls, n_devices: int, seed: int, het: float = 0.3, noise: float = 0.5, m: int = 12, n: int = 12,
             true_rank: int = 4, batch: int = 4) -> MatrixRegression:
        """Build the problem; ΔW* = U V/√rank (U ~ N(0,1), V ~ N(0,1/n)) has W0's scale; device i depends only on
        (seed, i), so adding devices leaves the others unchanged."""
        seeds = Seeds(seed)
        rng = seeds.numpy("fslora-theory/problem")
        w0 = rng.normal(0.0, 1 / math.sqrt(n), (m, n))
        delta = rng.normal(size=(m, true_rank)) @ rng.normal(0.0, 1 / math.sqrt(n), (true_rank, n))
        targets, scales = [], []
        for i in range(n_devices):
            dev = seeds.numpy("fslora-theory/device", i)
            targets.append(w0 + delta / math.sqrt(true_rank) + het * dev.normal(size=(m, n)) / math.sqrt(n))
            scales.append(dev.uniform(0.5, 1.5, n))
        return cls(w0, np.stack(targets), np.stack(scales), noise, batch)

    @property
    def n_devices(self) -> int:
        return self.targets.shape[0]

    def loss(self, w: np.ndarray) -> float:
        """Unsketched f(W) = (1/N) Σ_i ½ tr((W − W_i*) Σ_i (W − W_i*)ᵀ), Σ_i = L_i², without the noise constant."""
        err = w - self.targets
        return float(0.5 * np.sum(err**2 * self.scales[:, None, :] ** 2) / self.n_devices)

    def sample(self, rng: np.random.Generator, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """`steps` minibatches for every device: x (steps, N, batch, n), y (steps, N, batch, m)."""
        m, n = self.w0.shape
        x = rng.standard_normal((steps, self.n_devices, self.batch, n)) * self.scales[:, None, :]
        y = np.einsum("imn,hibn->hibm", self.targets, x)
        return x, y + self.noise * rng.standard_normal((steps, self.n_devices, self.batch, m))


@functools.cache
def sketch_diagonals(r: int, k: int) -> np.ndarray:
    """Diagonals of every S in S(r, k) (Def. 3.1), one row per k-subset I: (r/k)·1[j ∈ I]; read-only, cached."""
    out = np.zeros((math.comb(r, k), r))
    for row, subset in zip(out, itertools.combinations(range(r), k), strict=True):
        row[list(subset)] = r / k
    out.setflags(write=False)
    return out


def sketched_objective(problem: MatrixRegression, b: np.ndarray, a: np.ndarray,
                       ks: Sequence[int]) -> tuple[float, np.ndarray, np.ndarray]:
    """Exact f^S(B, A) = (1/N) Σ_i E_{S~S(r,k_i)} f_i(W0 + BSA) and its gradients (∇_B, ∇_A), by enumeration.

    Devices with equal k_i are pooled first: Σ_i f_i(W) = ½ Σ s ⊙ (W − W̄)² + const, s = Σ_i diag(Σ_i) and W̄ the
    s-weighted mean target, so the cost does not grow with N."""
    ks = np.asarray(ks)
    value, grad_b, grad_a = 0.0, np.zeros_like(b), np.zeros_like(a)
    for k in np.unique(ks):
        sigma = problem.scales[ks == k, None, :] ** 2  # (g, 1, n)
        targets = problem.targets[ks == k]
        weight = sigma.sum(0)
        mean_target = (sigma * targets).sum(0) / weight
        diag = sketch_diagonals(b.shape[1], int(k))  # (C, r)
        err = problem.w0 + (b * diag[:, None, :]) @ a - mean_target  # (C, m, n)
        grad_w = weight * err / len(diag)  # Σ_i ∇f_i at each W0 + BSA, weighted by P(S) = 1/C
        value += 0.5 * np.sum(err * grad_w) + 0.5 * np.sum(sigma * (targets - mean_target) ** 2)
        grad_b += np.sum((grad_w @ a.T) * diag[:, None, :], 0)
        grad_a += np.sum((b.T @ grad_w) * diag[:, :, None], 0)
    n_dev = problem.n_devices
    return value / n_dev, grad_b / n_dev, grad_a / n_dev


def sketched_loss_closed_form(w0: np.ndarray, b: np.ndarray, a: np.ndarray, x: np.ndarray, y: np.ndarray,
                              k: int) -> float:
    """§7.4: E_S ½‖(W0+BSA)x − y‖² = ℓ(W0+BA) + ½(r/k − 1)·r/(r−1)·Σ_j‖c_j − c̄‖², c_j = b_j(a_jᵀx), one (x, y)."""
    r = b.shape[1]
    comps = b * (a @ x)  # column j is c_j
    spread = np.sum((comps - comps.mean(1, keepdims=True)) ** 2)
    return float(0.5 * np.sum(((w0 + b @ a) @ x - y) ** 2) + 0.5 * (r / k - 1) * r / max(r - 1, 1) * spread)


@dataclass(frozen=True)
class Trajectory:
    """Exact ‖∇f^S‖², f^S and unsketched f at X^0..X^T (inf from a divergence on), and whether it diverged."""

    grad_sq: np.ndarray
    f_sketched: np.ndarray
    f_plain: np.ndarray
    diverged: bool

    def mean_grad_sq(self, start: float = 0.0) -> float:
        """Mean of ‖∇f^S(X^t)‖² over t in [start·T, T): start = 0 is the theorem's (1/T) Σ_t, 0.5 the last half."""
        rounds = len(self.grad_sq) - 1
        return float(np.mean(self.grad_sq[int(start * rounds):rounds]))


def _fslora_round(problem: MatrixRegression, b: np.ndarray, a: np.ndarray, ks: np.ndarray, lr: float,
                  local_steps: int, sketch_rng: np.random.Generator,
                  data_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One round of Alg. 1 in the §3.1 sub-block form, devices with equal k_i vectorised: the server draws k_i-subsets,
    each device runs H minibatch SGD steps on its block with factor r/k_i, the server adds the mean over all N."""
    (m, r), n = b.shape, a.shape[1]
    x, y = problem.sample(data_rng, local_steps)
    acc_b, acc_a = np.zeros_like(b), np.zeros_like(a)
    for k in np.unique(ks):
        dev = np.flatnonzero(ks == k)
        idx = np.sort(sketch_rng.random((len(dev), r)).argsort(1)[:, :k], 1)  # uniform k-subsets, (g, k)
        b0, a0 = b[:, idx].transpose(1, 0, 2), a[idx]  # (g, m, k), (g, k, n)
        bi, ai, c = b0, a0, r / k
        for h in range(local_steps):
            xs = x[h, dev]
            resid = xs @ (problem.w0 + c * bi @ ai).transpose(0, 2, 1) - y[h, dev]  # (g, batch, m)
            grad_w = resid.transpose(0, 2, 1) @ xs / problem.batch  # ∇ℓ at W0 + BSA, (g, m, n)
            bi, ai = bi - lr * c * grad_w @ ai.transpose(0, 2, 1), ai - lr * c * bi.transpose(0, 2, 1) @ grad_w
        np.add.at(acc_b.T, idx.ravel(), (bi - b0).transpose(0, 2, 1).reshape(-1, m))
        np.add.at(acc_a, idx.ravel(), (ai - a0).reshape(-1, n))
    return b + acc_b / len(ks), a + acc_a / len(ks)


def simulate_fslora(problem: MatrixRegression, ks: Sequence[int], rank: int, lr: float, local_steps: int,
                    rounds: int, seed: int) -> Trajectory:
    """FSLoRA from B = 0, A ~ N(0, 1/n) for `rounds` rounds (k_i = r is FedLoRA), recording the exact f^S and ∇f^S."""
    seeds = Seeds(seed)
    sketch_rng, data_rng = seeds.numpy("fslora-theory/sketch"), seeds.numpy("fslora-theory/data")
    m, n = problem.w0.shape
    b, a = np.zeros((m, rank)), seeds.numpy("fslora-theory/init").normal(0.0, 1 / math.sqrt(n), (rank, n))
    ks_arr = np.asarray(ks)
    stats = np.full((3, rounds + 1), np.inf)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(rounds + 1):
            value, grad_b, grad_a = sketched_objective(problem, b, a, ks_arr)
            stats[:, t] = np.sum(grad_b**2) + np.sum(grad_a**2), value, problem.loss(problem.w0 + b @ a)
            if not (np.isfinite(stats[:, t]).all() and value < DIVERGED):
                stats[:, t:] = np.inf
                return Trajectory(*stats, diverged=True)
            if t < rounds:
                b, a = _fslora_round(problem, b, a, ks_arr, lr, local_steps, sketch_rng, data_rng)
    return Trajectory(*stats, diverged=False)
