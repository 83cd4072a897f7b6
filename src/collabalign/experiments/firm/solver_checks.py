"""R0 of the FIRM reproduction (spec §8 R0, §3.0 properties, §7 item 1): the regularised MGDA solvers on random
instances. Every check is deterministic for its seed, so each is an exact claim (a count of violations, or a
largest deviation, against its declared tolerance)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveInt

from collabalign import claims
from collabalign.config import Grid, Strict
from collabalign.methods.firm.solver import gram, solve
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

AGREE = claims.exact(
    "R0: closed form, active set and projected gradient agree",
    "largest absolute difference of λ between the solvers (closed form only at M = 2) over random instances at every "
    "M and β, with trace normalisation, at most 1e-8", tolerance=1e-8)
INVARIANT = claims.exact(
    "R0: β = 0 weights ignore gradient scale, sign and normalisation",
    "largest change of λ* (β = 0) under a common rescaling (×1e-3, ×7) of the gradients, a sign flip of all of them "
    "and trace normalisation on/off, at most 1e-8", tolerance=1e-8)
MONOTONE = claims.exact(
    "R0: raising p_1 raises λ_1",
    "number of decreases of λ_1 (beyond 1e-10) along a rising p_1 grid, others fixed, over random instances: 0")
UNIFORM = claims.exact(
    "R0: β → ∞ gives uniform weights",
    "largest absolute deviation of λ_j from 1/M at β = 1e8 over random instances, at most 1e-6", tolerance=1e-6)
LEMMA8 = claims.exact(
    "R0: Lemma 8 bound on the weights' sensitivity holds",
    "number of random instance pairs (unnormalised G, β > 0) with ‖λ − λ'‖ > (4/β)‖G − G'‖_op or "
    "> (4RM/β) max_j ‖g_j − g'_j‖: 0 (worst ratios reported)")
VERTEX_FLIP = claims.exact(
    "R0: without regularisation λ* flips between vertices for nearly collinear gradients",
    "‖λ*_A − λ*_B‖ = √2 at β = 0 for two gradient pairs 1e-3 apart (one vertex to the other), tolerance 1e-9; the "
    "β = 0.01 distance is reported beside it", tolerance=1e-9)


class SolverConfig(Strict):
    run: bool = True
    instances: PositiveInt = 300  # per (M, β)
    objectives: Grid[Annotated[int, Field(ge=2)]] = [2, 3, 5]
    betas: Grid[NonNegativeFloat] = [0.0, 0.01, 0.1, 1.0]
    d: PositiveInt = 10


def instances(rng: np.random.Generator, n: int, d: int, M: int) -> np.ndarray:
    """Gradient matrices (n, d, M): Gaussian columns, a third of them nearly collinear (spread 1e-3 to 1e-1)."""
    A = rng.standard_normal((n, d, M)) * rng.uniform(0.1, 3, (n, 1, M))
    k = n // 3
    spread = 10 ** rng.uniform(-3, -1, (k, 1, 1))
    A[:k] = A[:k, :, :1] + spread * rng.standard_normal((k, d, M))
    return A


def agreement(cfg: SolverConfig, rng: np.random.Generator) -> dict[str, float]:
    """Largest solver disagreement per (M, β) and overall."""
    out = {}
    for M in cfg.objectives:
        for beta in cfg.betas:
            G = gram(instances(rng, cfg.instances, cfg.d, M))
            sols = {m: solve(G, beta=beta, method=m) for m in (["closed"] if M == 2 else []) + ["active", "pgd"]}
            ref = sols["active"]
            out[f"M={M} beta={beta:g}"] = max(float(np.abs(s - ref).max()) for s in sols.values())
    return out


def invariance(cfg: SolverConfig, rng: np.random.Generator) -> float:
    worst = 0.0
    for M in cfg.objectives:
        A = instances(rng, cfg.instances, cfg.d, M)
        ref = solve(gram(A), beta=0.0, normalize=False)
        for other in (gram(1e-3 * A), gram(7 * A), gram(-A)):
            worst = max(worst, float(np.abs(solve(other, beta=0.0, normalize=False) - ref).max()))
        worst = max(worst, float(np.abs(solve(gram(A), beta=0.0, normalize=True) - ref).max()))
    return worst


def monotone(cfg: SolverConfig, rng: np.random.Generator) -> int:
    violations = 0
    grid = np.geomspace(0.05, 20, 25)
    for M in cfg.objectives:
        G = gram(instances(rng, cfg.instances, cfg.d, M))
        rest = rng.uniform(0.2, 2, M - 1)
        lam1 = np.stack([solve(G, p=np.r_[p1, rest])[:, 0] for p1 in grid])  # (grid, n)
        violations += int((np.diff(lam1, axis=0) < -1e-10).sum())
    return violations


def uniform(cfg: SolverConfig, rng: np.random.Generator) -> float:
    return max(float(np.abs(solve(gram(instances(rng, cfg.instances, cfg.d, M)), beta=1e8) - 1 / M).max())
               for M in cfg.objectives)


def lemma8(cfg: SolverConfig, rng: np.random.Generator) -> dict[str, float]:
    """Worst ratios lhs / bound of both forms of Lemma 8 over random pairs (A, A') at every M and β > 0."""
    out = {"violations": 0}
    for M in cfg.objectives:
        for beta in [b for b in cfg.betas if b > 0]:
            A = instances(rng, cfg.instances, cfg.d, M)
            A2 = A + 10 ** rng.uniform(-3, 0, (len(A), 1, 1)) * rng.standard_normal(A.shape)
            G, G2 = gram(A), gram(A2)
            lhs = np.linalg.norm(solve(G, beta=beta, normalize=False) - solve(G2, beta=beta, normalize=False), axis=1)
            op = np.abs(np.linalg.eigvalsh(G - G2)).max(1)
            R = np.maximum(np.linalg.norm(A, axis=1).max(1), np.linalg.norm(A2, axis=1).max(1))
            per_col = np.linalg.norm(A - A2, axis=1).max(1)
            r_op, r_grad = lhs / (4 / beta * op), lhs / (4 * R * M / beta * per_col)
            out["violations"] += int((r_op > 1 + 1e-9).sum() + (r_grad > 1 + 1e-9).sum())
            out[f"M={M} beta={beta:g}"] = {"worst_ratio_op": float(r_op.max()), "worst_ratio_grad": float(r_grad.max())}
    return out


def vertex_flip() -> dict[str, float]:
    """g_1 = e_1 and g_2 = g_1 + 1e-3 (±cos 60°, sin 60°): the two instances are 1e-3 apart."""
    g1 = np.array([1.0, 0.0])
    pairs = [np.stack([g1, g1 + 1e-3 * np.array([s * 0.5, np.sqrt(3) / 2])], 1) for s in (1, -1)]
    out = {}
    for beta in (0.0, 0.01):
        lam = [solve(gram(A), beta=beta) for A in pairs]
        out[f"beta={beta:g}"] = float(np.linalg.norm(lam[0] - lam[1]))
        out[f"lambda_beta={beta:g}"] = [lam[0].tolist(), lam[1].tolist()]
    return out


def part(cfg: SolverConfig, seeds: Seeds, run_dir: RunDir) -> Part:
    """Every R0 check with its claim; the per-(M, β) details go to the metrics."""
    rng = seeds.numpy("firm/r0")
    agree, lem, flip = agreement(cfg, rng), lemma8(cfg, rng), vertex_flip()
    inv, mono, uni = invariance(cfg, rng), monotone(cfg, rng), uniform(cfg, rng)
    decided = [
        AGREE.decide(max(agree.values()), 0.0, per_setting=agree, instances=cfg.instances),
        INVARIANT.decide(inv, 0.0),
        MONOTONE.decide(mono, 0, grid_points=25),
        UNIFORM.decide(uni, 0.0),
        LEMMA8.decide(lem["violations"], 0, **{k: v for k, v in lem.items() if k != "violations"}),
        VERTEX_FLIP.decide(flip["beta=0"], np.sqrt(2), distance_beta_0_01=flip["beta=0.01"],
                           weights=flip),
    ]
    note = (f"R0 (spec §8): {cfg.instances} random instances per (M, β), d = {cfg.d}, a third nearly collinear. "
            "Solvers: closed form (M = 2), active-set enumeration with a pseudo-inverse KKT solve, FISTA projected "
            "gradient. Lemma 8 is checked on unnormalised G with D = (β/2)I, as in the theory.")
    return Part(claims=decided, metrics={"r0": {"agreement": agree, "lemma8": lem, "vertex_flip": flip,
                                                "invariance": inv, "monotone_violations": mono,
                                                "uniform_deviation": uni}}, notes=[note])
