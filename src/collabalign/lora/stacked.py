"""Many clients on one model: each LoRA layer's factors and each named head stacked along a party dimension, so N
clients that share a frozen base and differ only in adapters, heads and data train in one batched computation.

A client of rank k_i < k_max is zero-padded: its padded rows of A and columns of B get zero gradients (each is
multiplied by the other's zeros), so they stay zero under SGD or Adam and the client trains exactly its own block.
Each client keeps its own LoRA scale (`LoRALinear.party_scale`). Rows are routed by `Blocks` when every client
brings the same number, else by a per-row party index.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn

from collabalign.lora.inject import lora_layers
from collabalign.lora.layer import Blocks, LoRALinear, Party, _apply, _apply_blocks, _gather

Factors = tuple[Tensor, Tensor]  # (B (out, k), A (k, in))


class RoutedLinear(nn.Module):
    """A linear layer per party: weight (P, out, in), bias (P, out); rows routed as in `LoRALinear`."""

    def __init__(self, weight: Tensor, bias: Tensor):
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)
        self.party: Party = None

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.party, Blocks):
            out = _apply_blocks(x, self.weight, self.party)
            grouped = out.reshape(self.party.repeats, self.party.parties, -1, out.shape[-1])
            return (grouped + self.bias[None, :, None]).reshape(out.shape)
        weight = _gather(self.weight, self.party, None, rank_dim=1, name="weight")
        bias = _gather(self.bias, self.party, None, rank_dim=1, name="bias")
        return _apply(x, weight) + bias.reshape(bias.shape[0], *[1] * (x.dim() - 2), bias.shape[-1])


@dataclass
class Stack:
    """The stacked parameters (`params`, named `<layer>.B`, `<layer>.A`, `<head>.weight`, `<head>.bias` in `names`)
    and each client's rank per layer."""

    params: list[nn.Parameter] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    ranks: list[dict[str, int]] = field(default_factory=list)

    def add(self, name: str, param: nn.Parameter) -> None:
        self.params.append(param)
        self.names.append(name)

    def client(self, i: int) -> dict[str, np.ndarray]:
        """Client i's arrays by name (copies), its LoRA factors cut back to its own rank."""
        out = {}
        for name, p in zip(self.names, self.params, strict=True):
            layer, _, kind = name.rpartition(".")
            k = self.ranks[i].get(layer)
            value = p[i, :, :k] if kind == "B" else p[i, :k] if kind == "A" else p[i]
            out[name] = value.detach().cpu().numpy().copy()
        return out


def routing(sizes: Sequence[int], device: torch.device | str = "cpu") -> Party:
    """How rows laid out client after client, `sizes[i]` rows each, are routed: `Blocks` when all sizes are equal."""
    if len(set(sizes)) == 1:
        return Blocks(len(sizes))
    return torch.repeat_interleave(torch.arange(len(sizes), device=device), torch.as_tensor(sizes, device=device))


@contextmanager
def stacked(model: nn.Module, factors: Sequence[dict[str, Factors]] | None,
            scales: Sequence[float | dict[str, float]],
            heads: Sequence[dict[str, Factors]]) -> Iterator[Stack]:
    """Within the block, every LoRA layer of `model` holds the clients' factors stacked (zero-padded to the largest
    rank, each with its own scale, one per client or per client and layer) and each head module named in `heads`
    (client -> {module: (weight, bias)}) is a `RoutedLinear` of the clients' heads; yields the `Stack` (no LoRA
    factors when `factors` is None: the adapters are off). Route rows with
    `route(model, party)`. The model's own modules and factors come back on exit."""
    layers = lora_layers(model)
    saved = {name: (layer.A, layer.B, layer.rank, layer.rank_idx, layer.party, layer.party_scale, layer.enabled)
             for name, layer in layers.items()}
    swapped = {name: model.get_submodule(name) for name in heads[0]}
    stack = Stack(ranks=[{n: f[n][1].shape[0] for n in layers} for f in factors] if factors else [{}] * len(heads))
    try:
        for name, layer in layers.items():
            layer.enabled = factors is not None
            if factors is None:
                continue
            dtype, device = layer.base.weight.dtype, layer.base.weight.device
            k = max(f[name][1].shape[0] for f in factors)
            B = torch.zeros(len(factors), layer.base.out_features, k, dtype=dtype, device=device)
            A = torch.zeros(len(factors), k, layer.base.in_features, dtype=dtype, device=device)
            for i, client in enumerate(factors):
                b, a = client[name]
                B[i, :, : b.shape[1]], A[i, : a.shape[0]] = b, a
            layer.A, layer.B = nn.Parameter(A), nn.Parameter(B)
            layer.rank, layer.rank_idx = k, None
            layer.party_scale = torch.tensor([s[name] if isinstance(s, dict) else s for s in scales], dtype=dtype,
                                             device=device)
            stack.add(f"{name}.B", layer.B)
            stack.add(f"{name}.A", layer.A)
        for name, module in swapped.items():
            w = torch.stack([client[name][0] for client in heads]).to(module.weight)
            b = torch.stack([client[name][1] for client in heads]).to(module.weight)
            routed_head = RoutedLinear(w, b)
            _set_module(model, name, routed_head)
            stack.add(f"{name}.weight", routed_head.weight)
            stack.add(f"{name}.bias", routed_head.bias)
        yield stack
    finally:
        for name, layer in layers.items():
            layer.A, layer.B, layer.rank, layer.rank_idx, layer.party, layer.party_scale, layer.enabled = saved[name]
        for name, module in swapped.items():
            _set_module(model, name, module)


def route(model: nn.Module, party: Party) -> None:
    """Routes `party` to every LoRA layer and every `RoutedLinear` of the model."""
    for module in model.modules():
        if isinstance(module, RoutedLinear):
            module.party = party
        elif isinstance(module, LoRALinear):
            module.route(party)


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
