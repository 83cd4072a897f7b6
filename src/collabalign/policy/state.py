"""Optimiser state as named numpy arrays, so a client's Adam moments persist in its private `ClientContext.state`
across rounds (and checkpoint without pickle)."""

from __future__ import annotations

import numpy as np
import torch


def save_optimizer(opt: torch.optim.Optimizer, prefix: str) -> dict[str, np.ndarray]:
    """{'<prefix>.<param index>.<key>': array} for every tensor or number in the optimiser's per-parameter state."""
    out = {}
    for i, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            out[f"{prefix}.{i}.{key}"] = np.array(value.detach().cpu().numpy() if torch.is_tensor(value) else value)
    return out


def load_optimizer(opt: torch.optim.Optimizer, saved: dict[str, np.ndarray], prefix: str) -> None:
    """Restores what `save_optimizer` wrote (nothing to restore leaves the optimiser fresh)."""
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in saved.items():
        head, _, key = name.rpartition(".")
        owner, _, index = head.rpartition(".")
        if owner == prefix:
            state.setdefault(int(index), {})[key] = torch.as_tensor(np.array(value))
    if state:
        full = opt.state_dict()
        full["state"] = state
        opt.load_state_dict(full)
