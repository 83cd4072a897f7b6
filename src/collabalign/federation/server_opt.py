"""Server optimisers: the server treats the clients' combined change as a pseudo-gradient (Reddi et al. 2021, "Adaptive
Federated Optimization", Algorithm 2; FedAvgM: Hsu et al. 2019). With x_t the server's parameters and Δ_t = x̄_t - x_t
(x̄_t: the clients' parameters combined by the `aggregation` rule, a weighted mean by default), elementwise:

    fedavg      x_{t+1} = x_t + η Δ_t                                        (η = 1: the plain average)
    fedavgm     v_t = β1 v_{t-1} + Δ_t;                x_{t+1} = x_t + η v_t
    fedadagrad  m_t = β1 m_{t-1} + (1 - β1) Δ_t;  v_t = v_{t-1} + Δ_t²
    fedadam     m_t as fedadagrad;                  v_t = β2 v_{t-1} + (1 - β2) Δ_t²
    fedyogi     m_t as fedadagrad;                  v_t = v_{t-1} - (1 - β2) Δ_t² sign(v_{t-1} - Δ_t²)
                and for the three adaptive rules    x_{t+1} = x_t + η m_t / (√v_t + τ)

with m_{-1} = v_{-1} = 0 for FedAvgM, m_{-1} = 0 and v_{-1} = τ² for the adaptive rules (the paper asks v_{-1} ≥ τ²),
no bias correction (as the paper). Moments are float64; parameters keep their dtype.

Two rules change what the clients compute, and step on the server as `fedavg` (η = `lr`):

    fedprox     each local step's gradient gets μ (w - x_t), the gradient of (μ/2) ||w - x_t||² (Li et al. 2020)
    scaffold    each local step's gradient gets c - c_i (the server's and the client's control variates); after K
                local steps at lr η_l the client sets c_i⁺ = c_i - c + (x_t - y_i) / (K η_l) and sends Δc_i = c_i⁺ - c_i
                beside y_i; the server sets c ← c + (1/N) Σ Δc_i over the N clients (Karimireddy et al. 2020,
                Algorithm 1, option II; c = c_i = 0 at the start)

(`methods/fedavg.py` runs them: `FedOpt`, `methods/drift.py`'s gradient correction.) SCAFFOLD's option II estimates the
mean gradient exactly for local SGD; under a local Adam it is the same formula, a heuristic there.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, PositiveFloat

from collabalign.comm import Params
from collabalign.config import Strict

Rule = Literal["fedavg", "fedavgm", "fedprox", "scaffold", "fedadagrad", "fedadam", "fedyogi"]
ADAPTIVE = ("fedadagrad", "fedadam", "fedyogi")
CORRECTED = ("fedprox", "scaffold")  # the rules whose clients correct their local gradients


class ServerOptimizer(Strict):
    """How the server turns the clients' combined parameters into its next parameters (module doc)."""

    rule: Rule = "fedavg"
    lr: PositiveFloat = 1.0  # η, the server's step size
    beta1: float = Field(0.9, ge=0, lt=1)  # FedAvgM's momentum β; the adaptive rules' first-moment decay
    beta2: float = Field(0.99, ge=0, lt=1)  # fedadam / fedyogi: the second-moment decay
    tau: PositiveFloat = 1e-3  # the adaptive rules' degree of adaptivity (added to √v)
    mu: float = Field(0.01, ge=0)  # fedprox: the proximal term's weight μ

    @property
    def plain(self) -> bool:
        """Whether the next parameters are the combined ones themselves (FedAvg with η = 1): no state, no step."""
        return self.rule == "fedavg" and self.lr == 1.0


def server_side_only(opt: ServerOptimizer, method: str) -> ServerOptimizer:
    """`opt`, if it steps on the server alone; ValueError for FedProx and SCAFFOLD, whose clients must correct their
    local gradients, which `method`'s local steps do not take."""
    if opt.rule in CORRECTED:
        raise ValueError(f"{opt.rule} corrects the clients' local gradients, which {method}'s local steps do not take: "
                         "use fedavg, fedavgm, fedadagrad, fedadam or fedyogi")
    return opt


def initial_moments(opt: ServerOptimizer, params: Params) -> dict[str, Params]:
    """The rule's moments before round 1: {"m": ..., "v": ...} as the rule keeps them (module doc)."""
    zeros = {n: np.zeros(p.shape) for n, p in params.items()}
    if opt.rule == "fedavgm":
        return {"v": zeros}
    if opt.rule in ADAPTIVE:
        return {"m": zeros, "v": {n: np.full(p.shape, opt.tau**2) for n, p in params.items()}}
    return {}


def server_step(opt: ServerOptimizer, params: Params, combined: Params, moments: dict[str, Params]
                ) -> tuple[Params, dict[str, Params]]:
    """(x_{t+1}, the moments after round t) from x_t = `params`, x̄_t = `combined` and the moments before."""
    new_params, m_out, v_out = {}, {}, {}
    for name, x in params.items():
        delta = np.asarray(combined[name], np.float64) - x
        if opt.rule in ("fedavg", *CORRECTED):
            step = delta
        elif opt.rule == "fedavgm":
            step = v_out[name] = opt.beta1 * moments["v"][name] + delta
        else:
            m = m_out[name] = opt.beta1 * moments["m"][name] + (1 - opt.beta1) * delta
            v, sq = moments["v"][name], delta**2
            if opt.rule == "fedadagrad":
                v = v + sq
            elif opt.rule == "fedadam":
                v = opt.beta2 * v + (1 - opt.beta2) * sq
            else:
                v = v - (1 - opt.beta2) * sq * np.sign(v - sq)
            v_out[name] = v
            step = m / (np.sqrt(v) + opt.tau)
        new_params[name] = (x + opt.lr * step).astype(x.dtype)
    return new_params, ({"m": m_out} if m_out else {}) | ({"v": v_out} if v_out else {})
