"""Next-token choice for `Policy.generate`: greedy, temperature and nucleus (top-p) sampling from a given generator."""

from __future__ import annotations

import torch
from torch import Tensor


def sample_next(logits: Tensor, temperature: float | Tensor, top_p: float, generator: torch.Generator) -> Tensor:
    """One token per row (B, V) -> (B,): greedy at temperature 0, else nucleus sampling drawn from `generator`
    (on the generator's device, so a seed gives the same tokens wherever the model runs). A (B,) tensor of positive
    temperatures samples each row at its own temperature (one batch for several temperatures)."""
    if isinstance(temperature, Tensor):
        temperature = temperature.to(logits.device, torch.float32)[:, None]
    elif temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1).to(generator.device)
    if top_p >= 1.0:
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    sorted_p = sorted_p.masked_fill(sorted_p.cumsum(-1) - sorted_p >= top_p, 0.0)  # keep the smallest top-p prefix
    return order.gather(-1, torch.multinomial(sorted_p, 1, generator=generator)).squeeze(-1)
