"""One seed -> independent, reproducible numpy / torch generators per run, party and purpose."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(name: str) -> int:
    return zlib.crc32(name.encode())


class Seeds:
    """Derives generators from one integer seed; the same (seed, purpose, party) always gives the same stream."""

    def __init__(self, seed: int):
        self.seed = int(seed)

    def entropy(self, purpose: str = "", party: int | str | None = None) -> int:
        """A 63-bit integer unique to (seed, purpose, party)."""
        words = [self.seed, _key(purpose)]
        if party is not None:
            words.append(_key(str(party)) if isinstance(party, str) else 1 + int(party))
        return int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)

    def numpy(self, purpose: str = "", party: int | str | None = None) -> np.random.Generator:
        return np.random.default_rng(self.entropy(purpose, party))

    def torch(self, purpose: str = "", party: int | str | None = None) -> torch.Generator:
        return torch.Generator().manual_seed(self.entropy(purpose, party))

    def init_torch(self, purpose: str = "") -> None:
        """Seeds torch's global generator (module initialisers use it)."""
        torch.manual_seed(self.entropy(purpose))
