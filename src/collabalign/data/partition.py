"""Split item indices among clients: iid, label-skewed Dirichlet(alpha), or one client per key value."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from collabalign.data.errors import DataError

MAX_DIRICHLET_TRIES = 1000


def _check(n_items: int, n_clients: int, min_size: int) -> None:
    """Reject client counts and minimum sizes that cannot give every client min_size of n_items items."""
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if min_size < 0:
        raise ValueError(f"min_size must be >= 0, got {min_size}")
    if min_size * n_clients > n_items:
        raise DataError("split", None, None, f"cannot give {n_clients} clients {min_size} items each from "
                        f"only {n_items} items; lower the number of clients or the minimum per client, or add data")


def iid(n_items: int, n_clients: int, rng: np.random.Generator, min_size: int = 1) -> list[np.ndarray]:
    """A uniformly random split into near-equal parts (sizes differ by at most one), indices sorted per client."""
    _check(n_items, n_clients, min_size)
    return [np.sort(part) for part in np.array_split(rng.permutation(n_items), n_clients)]


def dirichlet(
    labels: Sequence[Hashable] | np.ndarray,
    n_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Label-skewed split: each label's items are shared among clients in Dirichlet(alpha) proportions.

    Small alpha gives each client few labels; large alpha approaches iid. The whole draw is repeated (at most
    MAX_DIRICHLET_TRIES times) until every client holds at least min_size items.
    """
    if not alpha > 0 or not np.isfinite(alpha):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    _check(len(labels), n_clients, min_size)
    groups = list(by_key(labels).values())
    owner = np.empty(len(labels), np.int64)
    for _ in range(MAX_DIRICHLET_TRIES):
        for members in groups:
            bounds = (np.cumsum(rng.dirichlet(np.full(n_clients, alpha)))[:-1] * len(members)).astype(np.int64)
            counts = np.diff(bounds, prepend=0, append=len(members))
            owner[rng.permutation(members)] = np.repeat(np.arange(n_clients), counts)
        sizes = np.bincount(owner, minlength=n_clients)
        if sizes.min() >= min_size:
            return np.split(np.argsort(owner, kind="stable"), np.cumsum(sizes)[:-1])
    raise DataError("split", None, None,
                    f"no Dirichlet(alpha={alpha}) draw in {MAX_DIRICHLET_TRIES} tries gave all {n_clients} clients "
                    f">= {min_size} of the {len(labels)} items ({len(groups)} label(s)); raise alpha, lower the "
                    "number of clients or the minimum per client, or add data")


def by_key(keys: Sequence[Hashable] | np.ndarray) -> dict[Hashable, np.ndarray]:
    """One group per distinct key (in order of first appearance), holding the sorted indices of its items."""
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys.tolist() if isinstance(keys, np.ndarray) else keys):
        groups.setdefault(key, []).append(i)
    return {key: np.asarray(idx, np.int64) for key, idx in groups.items()}


def label_skew(parts: Sequence[np.ndarray], labels: Sequence[Hashable] | np.ndarray) -> float:
    """Mean total-variation distance between each client's label distribution and the global one (0 = iid)."""
    codes = np.empty(len(labels), np.int64)
    for code, members in enumerate(by_key(labels).values()):
        codes[members] = code
    global_dist = np.bincount(codes) / len(codes)
    k = len(global_dist)
    dists = [np.bincount(codes[p], minlength=k) / len(p) for p in parts if len(p)]
    return float(np.mean([0.5 * np.abs(d - global_dist).sum() for d in dists]))
