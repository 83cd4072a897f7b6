"""Which LoRA factors are shared, per-user or frozen, switched in place between training phases, and the optional
Frobenius-norm projection of each user's update (spec §8.1: without it small-data runs diverge)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from collabalign.lora.layer import LoRALinear

Mode = Literal["shared", "user", "frozen"]


def configure(layer: LoRALinear, a: Mode, b: Mode, n_users: int) -> None:
    """Sets A and B to shared, per-user (the current value copied to every user) or frozen (kept as is)."""
    for name, mode in (("A", a), ("B", b)):
        w = getattr(layer, name).detach()
        per_user = w.dim() == 3
        if mode == "shared" and per_user:
            raise ValueError(f"{name} is per-user already; a per-user factor is never merged back into a shared one")
        if mode == "user" and not per_user:
            w = w.unsqueeze(0).expand(n_users, *w.shape)
        setattr(layer, name, nn.Parameter(w.clone(), requires_grad=mode != "frozen"))


def set_identity_down(layer: LoRALinear) -> None:
    """A = I (rank = in_features) and scale 1, so B alone is the full update Delta W = B: the full-matrix model."""
    d_in = layer.base.in_features
    layer.A = nn.Parameter(torch.eye(d_in, dtype=layer.base.weight.dtype))
    layer.B = nn.Parameter(torch.zeros(layer.base.out_features, d_in, dtype=layer.base.weight.dtype))
    layer.rank, layer.alpha, layer.rank_idx = d_in, float(d_in), None


def user_deltas(layer: LoRALinear) -> torch.Tensor:
    """scale * B_i A_i for every user, (P, out, in); one (1, out, in) entry when both factors are shared."""
    A, B = layer.A, layer.B
    delta = B @ A if A.dim() == 3 or B.dim() == 3 else (B @ A)[None]
    return layer.scale * delta


@torch.no_grad()
def project_(layer: LoRALinear, max_norm: float) -> None:
    """Rescales each user's personal factor so that ||scale * B_i A_i||_F <= max_norm (A when both are global)."""
    if not (layer.A.requires_grad or layer.B.requires_grad):
        return
    norms = user_deltas(layer).flatten(1).norm(dim=1)
    factor = (max_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
    target = layer.B if layer.B.dim() == 3 and layer.A.dim() == 2 else layer.A
    target.mul_(factor.view(-1, 1, 1) if target.dim() == 3 else factor)
