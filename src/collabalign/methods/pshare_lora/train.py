"""The methods as phase schedules over any reward model with LoRA layers, and one Bradley–Terry training loop.

A phase fixes, per LoRA layer (bottom to top), which factors are shared / per-user / frozen, its step count and
its learning-rate range. Every step is one forward pass over a batch that mixes users: each sample is routed to
its user's factors by `LoRALinear` (spec §9.6), so no Python loop over users runs in training.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from collabalign.lora.inject import lora_layers, routed
from collabalign.lora.layer import Blocks
from collabalign.methods.pshare_lora.sharing import Mode, configure, project_, set_identity_down
from collabalign.models.reward import bt_loss

METHODS = ("global", "local", "share_rep", "pshare_si", "pshare_g", "pshare_wu", "share_a", "full")
VARIANTS = ("share_rep_phased", "share_rep_same_head", "frozen", "frozen_per_user")  # only where a config lists them
LABELS = {"global": "LoRA-global", "local": "LoRA-local", "share_rep": "Share Rep", "pshare_si": "P-ShareLoRA (SI)",
          "pshare_g": "P-ShareLoRA (G)", "pshare_wu": "P-ShareLoRA (WU)", "share_a": "share-A ablation",
          "full": "full per-user matrices", "share_rep_phased": "Share Rep (global then personal; ablation)",
          "share_rep_same_head": "Share Rep (same head)", "frozen": "frozen backbone (trained head)",
          "frozen_per_user": "frozen backbone (a head per user)"}
GLOBAL: tuple[Mode, Mode] = ("shared", "shared")
FROZEN: tuple[Mode, Mode] = ("frozen", "frozen")
PERSONAL: tuple[Mode, Mode] = ("user", "user")


@dataclass
class Prefs:
    """n preference pairs: the user of each pair and the chosen / rejected inputs (rows aligned)."""

    users: Tensor
    chosen: Tensor
    rejected: Tensor

    def __len__(self) -> int:
        return len(self.users)

    def __getitem__(self, idx: Tensor | slice) -> Prefs:
        return Prefs(self.users[idx], self.chosen[idx], self.rejected[idx])

    def blocks(self, n_users: int) -> Blocks | None:
        """The routing layout of `pair_loss`'s rows (chosen then rejected) when the pairs are sorted by user in equal
        blocks covering every user, else None (rows are then routed one by one)."""
        if len(self) == 0 or len(self) % n_users:
            return None
        grouped = torch.arange(n_users, device=self.users.device).repeat_interleave(len(self) // n_users)
        return Blocks(n_users, repeats=2) if torch.equal(self.users, grouped) else None


def per_user_mean(users: Tensor, values: Tensor, n_users: int) -> Tensor:
    """Mean of `values` over each user's samples (float64)."""
    return torch.bincount(users, values.double(), n_users) / torch.bincount(users, minlength=n_users)


@dataclass(frozen=True)
class Phase:
    """`steps` optimiser steps at a learning rate going linearly from lr[0] to lr[1], with per-layer factor modes."""

    steps: int
    lr: tuple[float, float]
    modes: tuple[tuple[Mode, Mode], ...]


def schedule(method: str, n_layers: int, steps: int, lr: float, linear: bool = False, global_fraction: float = 2 / 3,
             warmup_fraction: float = 0.1, frozen_fraction: float = 0.7, frozen_layers: int | None = None
             ) -> list[Phase]:
    """The phases of `method` for `steps` steps in total (spec §3.3–3.6: every method gets the same budget).

    G: global for `global_fraction` of the steps, then P-ShareLoRA at lr/3 (spec §3.3). WU: global for
    `warmup_fraction`, then P-ShareLoRA continuing the same schedule. Share Rep (either head): the bottom
    floor(frozen_fraction * L) layers (or exactly `frozen_layers`) frozen and the top layers per-user, in one phase
    over the whole budget. The phased ablation: a global phase as long as G's, then that split at lr/3 like G.
    Frozen: every LoRA factor frozen at its initial zero update, so only a model's score head trains (the floor a
    task must be learned above); with a head per user (`frozen_per_user`) the personalised floor.
    `linear`: the rate decays to 0 over the whole budget (the paper's schedule), else it is constant.
    """
    def rate(t: int) -> float:
        return lr * (1 - t / steps) if linear else lr

    def phase(t0: int, t1: int, modes: tuple[Mode, Mode] | list[tuple[Mode, Mode]],
              start: float | None = None) -> Phase:
        per_layer = tuple(modes) if isinstance(modes, list) else (modes,) * n_layers
        first = rate(t0) if start is None else start
        return Phase(t1 - t0, (first, rate(t1) if linear else first), per_layer)

    bottom = math.floor(frozen_fraction * n_layers) if frozen_layers is None else frozen_layers
    # Paper §5: "the first 70% of the reward model's layers are frozen as the shared representation, while the
    # remaining 30% are treated as personalized heads": frozen from the start, never trained (spec §3.6).
    share_rep = [FROZEN] * bottom + [PERSONAL] * (n_layers - bottom)
    personal = {"global": GLOBAL, "local": PERSONAL, "pshare_si": ("user", "shared"), "share_a": ("shared", "user"),
                "full": ("frozen", "user"), "share_rep": share_rep, "share_rep_same_head": share_rep,
                "frozen": FROZEN, "frozen_per_user": FROZEN}
    if method in personal:
        return [phase(0, steps, personal[method])]
    if method == "pshare_wu":
        t = round(warmup_fraction * steps)
        return [phase(0, t, GLOBAL), phase(t, steps, ("user", "shared"))]
    t = round(global_fraction * steps)
    if method == "pshare_g":
        return [phase(0, t, GLOBAL), phase(t, steps, ("user", "shared"), start=lr / 3)]
    if method == "share_rep_phased":
        return [phase(0, t, GLOBAL), phase(t, steps, share_rep, start=lr / 3)]
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS + VARIANTS)}")


def prepare(model: nn.Module, method: str, n_users: int, generator: torch.Generator) -> None:
    """Initial factors (spec §3.3–3.5, §9.4): every method starts from one kaiming draw of A and B = 0, copied to
    every user when personal (SI: identical users); LoRA-local draws each user's A independently; full: A = I."""
    for layer in lora_layers(model).values():
        layer.reset_parameters(generator)
        if method == "local":
            configure(layer, "user", "user", n_users)
            layer.reset_parameters(generator)
        elif method == "full":
            set_identity_down(layer)


def batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor | slice]:
    """Endless mini-batch indices, a fresh permutation per epoch; batch_size 0 means the full data every step (a
    slice: no copy)."""
    while True:
        if batch_size <= 0:
            yield slice(0, n)
            continue
        perm = torch.randperm(n, generator=generator)
        yield from (perm[i:i + batch_size] for i in range(0, n, batch_size))


def pair_loss(model: nn.Module, batch: Prefs, layout: Blocks | None = None) -> Tensor:
    """Bradley–Terry loss of a mixed-user batch: chosen and rejected rows in ONE routed forward pass (`layout`: the
    batch's `Prefs.blocks`, when known, routes blockwise instead of row by row)."""
    users = layout if layout is not None else torch.cat([batch.users, batch.users])
    with routed(model, users):
        r = model(torch.cat([batch.chosen, batch.rejected]))
    n = len(batch)
    return bt_loss(r[:n], r[n:])


def backward(model: nn.Module, batch: Prefs, layout: Blocks | None, micro_batch: int) -> Tensor:
    """The batch's mean Bradley–Terry loss with its gradient accumulated, in chunks of `micro_batch` pairs if > 0.
    The routing stays set through each backward: gradient-checkpointed blocks re-run their forward there."""
    chunks = [torch.arange(len(batch))] if micro_batch <= 0 else torch.arange(len(batch)).split(micro_batch)
    total = torch.zeros(())
    for chunk in chunks:
        part = batch if len(chunks) == 1 else batch[chunk]
        users = layout if len(chunks) == 1 and layout is not None else torch.cat([part.users, part.users])
        with routed(model, users):
            loss = pair_loss(model, part, layout if len(chunks) == 1 else None) * (len(chunk) / len(batch))
            loss.backward()
        total = total + loss.detach().cpu()
    return total


def train(model: nn.Module, data: Prefs, phases: list[Phase], n_users: int, batch_size: int,
          generator: torch.Generator, max_norm: float | None = None, micro_batch: int = 0) -> list[float]:
    """Runs the phases with Adam (a fresh optimiser per phase, as the factors change shape); returns the losses.
    `micro_batch` > 0 accumulates each batch's gradient over chunks of that many pairs (same step, less memory)."""
    layers = list(lora_layers(model).values())
    stream = batches(len(data), batch_size, generator)
    layout = data.blocks(n_users) if batch_size <= 0 and micro_batch <= 0 else None
    losses = []
    for phase in phases:
        for layer, (a, b) in zip(layers, phase.modes, strict=True):
            configure(layer, a, b, n_users)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.Adam(params, lr=phase.lr[0])
        for t in range(phase.steps):
            for group in opt.param_groups:
                group["lr"] = phase.lr[0] + (phase.lr[1] - phase.lr[0]) * t / phase.steps
            opt.zero_grad(set_to_none=True)
            loss = backward(model, data[next(stream)], layout, micro_batch)
            opt.step()
            if max_norm is not None:
                for layer in layers:
                    project_(layer, max_norm)
            losses.append(float(loss.detach()))
    return losses
