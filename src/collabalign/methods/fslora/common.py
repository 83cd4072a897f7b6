"""Pieces every heterogeneous-rank LoRA method shares: per-device ranks, the global LoRA scale, head averaging,
and scattering rank-k block updates back into the global factors."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from collabalign.comm import Message
from collabalign.federation.server_opt import ServerOptimizer, initial_moments, server_side_only, server_step
from collabalign.seeding import Seeds

PAPER_RATIOS = (0.125, 0.25, 0.5, 0.75)
HEAD = "head/"  # prefix of head arrays in messages and server state


def device_ranks(seeds: Seeds, device_ids: Sequence[str], rank: int,
                 ratios: Sequence[float] = PAPER_RATIOS) -> dict[str, int]:
    """k_i = ratio_i * r with ratio_i drawn once per device, uniformly from `ratios` (seeded, fixed for the run)."""
    rng = seeds.numpy("device-ranks")
    drawn = rng.choice(np.asarray(ratios, dtype=np.float64), size=len(device_ids))
    return {cid: max(1, int(round(q * rank))) for cid, q in zip(device_ids, drawn, strict=True)}


def lora_scale(alpha: float, rank: int) -> float:
    """s = alpha / sqrt(r_global) (rsLoRA, as the authors' code), one constant for every method and device."""
    return alpha / math.sqrt(rank)


def head_arrays(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {HEAD + k: v for k, v in params.items()}


def head_of(message_or_state) -> dict[str, np.ndarray]:
    return {k[len(HEAD):]: v for k, v in message_or_state.items() if k.startswith(HEAD)}


def mean_head(replies: Sequence[Message]) -> dict[str, np.ndarray]:
    """Plain average of the devices' trained heads (every method FedAvg's the head)."""
    names = [k for k in replies[0] if k.startswith(HEAD)]
    return {k: np.mean(np.stack([r[k] for r in replies]), axis=0).astype(replies[0][k].dtype) for k in names}


def scatter_mean(shape: tuple[int, int], axis: int, blocks: Sequence[np.ndarray], indices: Sequence[np.ndarray],
                 n_devices: int) -> np.ndarray:
    """(1/N) * sum_i of block_i placed at positions indices_i along `axis` (columns of B: axis 1; rows of A:
    axis 0), zeros elsewhere, in one scatter-add. Positions no device touched stay 0."""
    idx = torch.from_numpy(np.concatenate(indices).astype(np.int64))
    stacked = torch.from_numpy(np.concatenate(blocks, axis=axis).astype(np.float64))
    acc = torch.zeros(shape, dtype=torch.float64).index_add_(axis, idx, stacked)
    return (acc / n_devices).numpy()


class ServerAdam:
    """The authors' code's server step: the averaged update (proposed - current) is fed, negated, as a gradient to
    Adam (Kingma & Ba, bias-corrected). Its moments live in the server state under `opt/` and are never sent.
    Eq. (5) of the paper is the plain step proposed = current + mean update, which this replaces when chosen."""

    def __init__(self, lr: float = 5e-4, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        self.lr, self.betas, self.eps = lr, betas, eps

    def step(self, state: dict[str, np.ndarray], proposed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Returns `proposed` with every float array replaced by its Adam step from `state`."""
        b1, b2 = self.betas
        t = int(state.get("opt/t", np.zeros(1))[0]) + 1
        out = dict(proposed)
        for key, new in proposed.items():
            if key.startswith("opt/") or key not in state or not np.issubdtype(new.dtype, np.floating):
                continue  # Adam steps the float parameters only (not its own moments, not integer settings)
            grad = (state[key] - new).astype(np.float64)
            m = b1 * state.get(f"opt/m/{key}", 0.0) + (1 - b1) * grad
            v = b2 * state.get(f"opt/v/{key}", 0.0) + (1 - b2) * grad ** 2
            step = self.lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + self.eps)
            out[key] = (state[key] - step).astype(state[key].dtype)
            out[f"opt/m/{key}"], out[f"opt/v/{key}"] = m, v
        out["opt/t"] = np.array([t], np.int64)
        return out


class ServerRule:
    """A `federation.server_opt` rule (FedAvgM, FedAdagrad, FedAdam, FedYogi, FedAvg at a step size) in place of the
    plain averaged step: x_{t+1} from x_t and the averaged proposal, for every float array the method averages (the
    rule's moments under `opt/m/`, `opt/v/` in the server state, never sent). FedProx and SCAFFOLD are refused: the
    family's local steps take no gradient correction."""

    def __init__(self, opt: ServerOptimizer):
        self.opt = server_side_only(opt, "the FSLoRA family")

    def step(self, state: dict[str, np.ndarray], proposed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [k for k, v in proposed.items()
                 if not k.startswith("opt/") and k in state and np.issubdtype(v.dtype, np.floating)]
        params = {n: state[n] for n in names}
        moments = {kind: {n: state[f"opt/{kind}/{n}"] for n in names}
                   for kind in ("m", "v") if names and f"opt/{kind}/{names[0]}" in state}
        new, moments = server_step(self.opt, params, {n: proposed[n] for n in names},
                                   moments or initial_moments(self.opt, params))
        out = dict(proposed) | new
        for kind, arrays in moments.items():
            out |= {f"opt/{kind}/{n}": v for n, v in arrays.items()}
        return out


ServerStep = ServerAdam | ServerRule  # what a family method's `server` takes in place of the plain averaged step


def server_rule(opt: ServerOptimizer | None) -> ServerRule | None:
    """The rule as a family method's `server`, or None when it is the plain averaged step."""
    return None if opt is None or opt.plain else ServerRule(opt)
