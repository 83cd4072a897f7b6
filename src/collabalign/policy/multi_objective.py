"""Per-objective gradients on one shared forward, and writing a combined direction back, so a rule such as MGDA can
choose how M objectives mix at every step."""

from __future__ import annotations

import torch
from torch import Tensor


def objective_gradients(losses: Tensor, params: list[Tensor]) -> Tensor:
    """G (d, M): column j is the gradient of losses[j] flattened over all `params` (float32, zeros where unused),
    one backward per objective through the same graph."""
    columns = []
    for loss in losses:
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        columns.append(torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1).float()
                                  for g, p in zip(grads, params, strict=True)]))
    return torch.stack(columns, 1)


def write_gradient(params: list[Tensor], flat: Tensor) -> None:
    """Sets each parameter's .grad to its slice of the flat vector `flat` (d,), as an optimiser step expects."""
    sizes = [p.numel() for p in params]
    if flat.numel() != sum(sizes):
        raise ValueError(f"gradient has {flat.numel()} entries, the parameters {sum(sizes)}")
    for p, g in zip(params, flat.split(sizes), strict=True):
        p.grad = g.reshape(p.shape).to(p.dtype).clone()
