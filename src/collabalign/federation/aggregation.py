"""How a FedAvg-family server combines its clients' parameters: the sample-weighted mean (FedAvg), or robust rules
(coordinate-wise median, trimmed mean), optionally with client-level differential privacy (each update clipped, the
Gaussian mechanism on their sum; the privacy spent comes from dp-accounting's RDP accountant, see `privacy_spent`).

dp-accounting (Google's maintained accountant library) is used rather than Opacus: our mechanism is the sampled
Gaussian over clients, which dp-accounting composes exactly for fixed-size sampling without replacement (the way
`sample_clients` draws), with no dependence on torch modules or optimizers.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from collabalign.comm import Message, Params
from collabalign.config import Strict


class Privacy(Strict):
    """Client-level DP: every client's update clipped to L2 norm `clip`, Gaussian noise of standard deviation
    `noise_multiplier * clip` added to their sum, the sum divided by the number of replies."""

    clip: float = Field(gt=0)
    noise_multiplier: float = Field(ge=0)
    delta: float = Field(1e-5, gt=0, lt=1)
    seed: int = Field(0, ge=0, description="the noise stream; experiments set it from the run seed")


class Aggregation(Strict):
    rule: Literal["mean", "median", "trimmed_mean"] = "mean"
    trim: float = Field(0.1, ge=0, lt=0.5, description="fraction cut at each end per coordinate (trimmed_mean)")
    privacy: Privacy | None = None


def weighted_average(replies: list[Message], weights: np.ndarray) -> Params:
    """sum_i w_i * params_i / sum_i w_i for every array name, stacked and reduced in one op per name."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    return {name: np.tensordot(w, np.stack([r[name] for r in replies]), axes=1).astype(replies[0][name].dtype)
            for name in replies[0]}


def combine(base: Params, replies: list[Message], weights: np.ndarray, cfg: Aggregation, round_: int) -> Params:
    """The new server parameters from the clients' (each reply holds every array of `base`, trained)."""
    if cfg.privacy is not None:
        return _private_mean(base, replies, cfg.privacy, round_)
    if cfg.rule == "mean":
        return weighted_average(replies, weights)
    out = {}
    for name in replies[0]:
        stacked = np.stack([r[name] for r in replies]).astype(np.float64)
        if cfg.rule == "median":
            value = np.median(stacked, axis=0)
        else:
            cut = int(np.floor(cfg.trim * len(replies)))
            value = np.sort(stacked, axis=0)[cut:len(replies) - cut].mean(0)
        out[name] = value.astype(replies[0][name].dtype)
    return out


def _private_mean(base: Params, replies: list[Message], dp: Privacy, round_: int) -> Params:
    """base + (sum_i clip(u_i) + N(0, (z C)^2)) / m with u_i = reply_i - base (one global L2 norm per client)."""
    names = list(base)
    updates = np.stack([np.concatenate([(r[n].astype(np.float64) - base[n]).ravel() for n in names])
                        for r in replies])
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    clipped = updates * np.minimum(1.0, dp.clip / np.maximum(norms, 1e-300))
    rng = np.random.default_rng([dp.seed, round_])
    noisy = (clipped.sum(0) + rng.normal(0.0, dp.noise_multiplier * dp.clip, clipped.shape[1])) / len(replies)
    out, start = {}, 0
    for n in names:
        size = base[n].size
        out[n] = (base[n] + noisy[start:start + size].reshape(base[n].shape)).astype(base[n].dtype)
        start += size
    return out


def privacy_spent(dp: Privacy, n_clients: int, per_round: int, rounds: int) -> float:
    """ε at `dp.delta` after `rounds` rounds of `per_round` clients drawn without replacement from `n_clients`
    (RDP accountant, replace-one neighbours: replacing one client moves the clipped sum by up to 2 C, so the
    accountant's noise multiplier is noise_multiplier / 2). Infinite without noise."""
    from dp_accounting import GaussianDpEvent, SampledWithoutReplacementDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant
    from dp_accounting.rdp.rdp_privacy_accountant import NeighborRel

    if dp.noise_multiplier == 0 or rounds == 0:
        return float("inf") if rounds else 0.0
    event = SelfComposedDpEvent(SampledWithoutReplacementDpEvent(
        n_clients, per_round, GaussianDpEvent(dp.noise_multiplier / 2)), rounds)
    accountant = RdpAccountant(neighboring_relation=NeighborRel.REPLACE_ONE)
    accountant.compose(event)
    return float(accountant.get_epsilon(dp.delta))
