"""R3's toy world (spec §8 R3): its sizes, the random replicate worlds (features, base model, LoRA start, token
values, prompt risk), the two sigmoid reward models, and their table over every response of every prompt type."""

from __future__ import annotations

import itertools

import numpy as np
from pydantic import Field, PositiveInt, model_validator

from collabalign.config import Strict

CORRELATION = 0.9  # c: the correlated world's weight on the shared quality
M = 2  # objectives: helpfulness, harmlessness
MAX_RESPONSES = 100_000  # vocab ** length: the exact evaluation enumerates every response


class ToySizes(Strict):
    """The toy model's sizes (spec §8 R3's by default)."""

    vocab: int = Field(12, ge=2)  # V
    length: PositiveInt = 4  # L, tokens per response
    prompts: PositiveInt = 8  # P, prompt types
    hidden: PositiveInt = 16  # h, the frozen features' width
    rank: PositiveInt = 4  # r, the LoRA analogue's rank

    @model_validator(mode="after")
    def _enumerable(self) -> ToySizes:
        if self.vocab ** self.length > MAX_RESPONSES:
            raise ValueError(f"vocab ** length = {self.vocab} ** {self.length} responses: the exact held-out "
                             f"evaluation enumerates them all, at most {MAX_RESPONSES:,}")
        return self


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), elementwise."""
    return 1.0 / (1.0 + np.exp(-x))


class World:
    """`replicates` independent toy worlds: features phi (R, P, L, h), base W0 (R, V, h), LoRA start A0 (R, r, h),
    token values help / harm / qual / help_alt (R, V) and prompt risk (P,), of the given sizes."""

    def __init__(self, rng: np.random.Generator, replicates: int, sizes: ToySizes):
        R, V, h = replicates, sizes.vocab, sizes.hidden
        self.phi = rng.standard_normal((R, sizes.prompts, sizes.length, h)) / np.sqrt(h)
        self.w0 = 0.5 * rng.standard_normal((R, V, h))
        self.a0 = 0.1 * rng.standard_normal((R, sizes.rank, h))
        self.help = rng.uniform(-1, 1, (R, V))
        self.harm = 1.5 * np.maximum(self.help, 0) + rng.uniform(-0.3, 0.3, (R, V))
        self.qual = rng.uniform(-1, 1, (R, V))
        self.help_alt = 0.8 * self.help + 0.6 * rng.uniform(-1, 1, (R, V))
        self.risk = np.linspace(0, 1, sizes.prompts)
        self.replicates, self.sizes = R, sizes


def rewards(help_sum: np.ndarray, harm_sum: np.ndarray, qual_sum: np.ndarray, risk: np.ndarray,
            correlated: np.ndarray) -> np.ndarray:
    """(r_help, r_harm) (..., 2) from the token sums of a response and its prompt's risk (spec §8 R3)."""
    c = CORRELATION
    r_help = np.where(correlated, c * qual_sum + (1 - c) * help_sum, help_sum)
    r_harm = np.where(correlated, c * qual_sum - (1 - c) * 2 * risk * harm_sum + 0.5, 1 - 2 * risk * harm_sum)
    return sigmoid(np.stack(np.broadcast_arrays(r_help, r_harm), -1))


def expectation_subscripts(length: int) -> str:
    """The einsum of `Toy.evaluate`: the reward table (P, V, …, V, M) contracted with the L per-position
    distributions (n, P, V), e.g. "pabcdm,npa,npb,npc,npd->nm" for L = 4."""
    positions = "abcdefghijkloqrstuvwxyz"[:length]  # vocab >= 2: at most log2(MAX_RESPONSES) < 17 positions
    return f"p{positions}m," + ",".join(f"np{c}" for c in positions) + "->nm"


def response_rewards(world: World) -> np.ndarray:
    """The base reward models' (help, harm) of every response to every prompt type, in both worlds:
    (2, R, P, V, …, V, M) with one V axis per position; world 0 is the independent one, 1 the correlated one."""
    V, L = world.sizes.vocab, world.sizes.length
    combos = np.array(list(itertools.product(range(V), repeat=L)))  # every response (V^L, L)
    sums = [t[:, combos].sum(-1)[:, None, :] for t in (world.help, world.harm, world.qual)]  # (R, 1, V^L)
    risk = world.risk[None, :, None]
    table = np.stack([rewards(*sums, risk, np.array(c)) for c in (False, True)])  # (2, R, P, V^L, M)
    return table.reshape(*table.shape[:3], *([V] * L), M)
