"""The local gradient correction of FedProx and SCAFFOLD (`federation.server_opt`): after each backward pass of a local
step, every trainable parameter's gradient gets mu (p - anchor) + shift. A trainer that takes `correction=` calls
`apply` once per step, between `backward()` and the optimiser's step."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from collabalign.comm import Params


@dataclass
class Correction:
    """mu (p - anchor) + shift for every named parameter; counts the steps it corrected (SCAFFOLD's K)."""

    anchor: dict[str, Tensor]
    mu: float = 0.0
    shift: dict[str, Tensor] | None = None
    steps: int = 0

    @classmethod
    def of(cls, anchor: Params, mu: float = 0.0, shift: Params | None = None) -> Correction:
        tensors = lambda params: {n: torch.from_numpy(v.copy()) for n, v in params.items()}  # noqa: E731
        return cls(tensors(anchor), mu, None if shift is None else tensors(shift))

    @torch.no_grad()
    def apply(self, named: dict[str, Tensor]) -> None:
        for name, p in named.items():
            if p.grad is None:
                continue
            if self.mu:
                p.grad.add_(p.detach() - self.anchor[name].to(p.device, p.dtype), alpha=self.mu)
            if self.shift is not None:
                p.grad.add_(self.shift[name].to(p.device, p.dtype))
        self.steps += 1
