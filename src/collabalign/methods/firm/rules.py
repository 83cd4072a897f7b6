"""What the vectorised FIRM simulations share: the λ rules (FIRM, FedCMOO-A, FedAvg-LS, FMOL), the drift metrics of
spec §3.6 on batches of clients, exact Pareto stationarity, and a traffic counter that builds every message as a
`comm.Message` of float32 arrays, so the counted bytes are the serialised bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collabalign.comm import Ledger, Message
from collabalign.methods.firm.solver import gram, solve

KINDS = ("firm", "fedcmoo", "ls", "fmol")


@dataclass(frozen=True)
class Rule:
    """How clients weight their M objectives: "firm" (own regularised MGDA at every local step, β or preference p),
    "fedcmoo" (FedCMOO-A: one server β = 0 MGDA per round on client-averaged gradients at θ_t), "ls" (fixed weights
    w, uniform when None: FedAvg-LS) or "fmol" (server β = 0 MGDA on the averaged gradients at every local step)."""

    kind: str
    beta: float = 0.01
    p: tuple[float, ...] | None = None
    w: tuple[float, ...] | None = None
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"rule kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def label(self) -> str:
        if self.kind == "firm":
            return "firm " + (f"p={'/'.join(f'{x:.3g}' for x in self.p)}" if self.p else f"beta={self.beta:g}")
        return {"fedcmoo": "fedcmoo-a", "ls": "fedavg-ls", "fmol": "fmol"}[self.kind]

    def fixed(self, M: int) -> np.ndarray:
        """FedAvg-LS weights (M,)."""
        w = np.full(M, 1.0 / M) if self.w is None else np.asarray(self.w, dtype=np.float64)
        if w.shape != (M,) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
            raise ValueError(f"fixed weights must be {M} non-negative numbers summing to 1, got {self.w}")
        return w

    def local(self, grads: np.ndarray) -> np.ndarray:
        """FIRM's client-side weights for gradients (..., d, M)."""
        return solve(gram(grads), beta=self.beta, p=self.p, normalize=self.normalize)


def server_weights(grads: np.ndarray) -> np.ndarray:
    """The server's β = 0 MGDA on the client-averaged gradients (..., C, d, M) -> (..., M) (FedCMOO-A, FMOL)."""
    return solve(gram(grads.mean(-3)), beta=0.0, normalize=True)


def dispersion(lam: np.ndarray) -> np.ndarray:
    """D_λ = (1/C) Σ_c ‖λ^c − λ̄‖² for weights (..., C, M)."""
    return ((lam - lam.mean(-2, keepdims=True)) ** 2).sum(-1).mean(-1)


def disagreement(grads: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """The exact T^disagr = ‖(1/C) Σ_c Σ_j g^{j,c} (λ^{j,c} − λ̄^j)‖² for gradients (..., C, d, M) and weights
    (..., C, M)."""
    dev = lam - lam.mean(-2, keepdims=True)
    return ((np.einsum("...cdm,...cm->...d", grads, dev) / lam.shape[-2]) ** 2).sum(-1)


def stationarity(grads: np.ndarray, lam: np.ndarray | None = None) -> np.ndarray:
    """‖∇J λ‖² for exact gradients (..., d, M): at the minimising λ (Pareto stationarity, Def. 3) or at a given λ."""
    G = gram(grads)
    if lam is None:
        lam = solve(G, beta=0.0, normalize=False)
    return np.maximum(np.einsum("...i,...ij,...j->...", lam, G, lam), 0.0)  # >= 0 up to rounding


@dataclass
class Traffic:
    """Every message of one replicate: `ledger` holds the serialised bytes per (round, client, direction) and
    `payload` the array bytes (float32 values) per direction, the quantity the papers' O(·) formulas count."""

    ledger: Ledger = field(default_factory=Ledger)
    payload: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})

    def send(self, round_: int, clients: int, direction: str, own: dict[str, np.ndarray] | None = None,
             shared: dict[str, np.ndarray] | None = None) -> None:
        """One message per client: row c of each `own` array (leading axis = clients) plus the `shared` arrays."""
        for c in range(clients):
            arrays = {**{k: v[c] for k, v in (own or {}).items()}, **(shared or {})}
            msg = Message({k: np.asarray(v, np.float32) for k, v in arrays.items()})
            self.ledger.record(round_, f"client{c:02d}", direction, msg.nbytes)
            self.payload[direction] += msg.array_nbytes
