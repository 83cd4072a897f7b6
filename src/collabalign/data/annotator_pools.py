"""Item pools for simulated preference annotators (docs/methods/affpcl.md §8.3): synthetic Gaussian items, and HH-RLHF
pairs with measurable attributes of each reply.

An item is a pair s = (x, y_a, y_b) with features z = phi(x, y_a) - phi(x, y_b) in R^d and K attribute margins
a(s) = attr(x, y_a) - attr(x, y_b). Per reply y of an HH pair (prompt x, chosen, rejected), three attributes:
  harmless   1 if y is the dataset's `chosen` reply (the HH harmlessness label), else 0;
  length     log(1 + number of word-piece tokens of y);
  apology    number of whole-word apology / refusal markers in y (APOLOGY_WORDS; VADER, the spec's lexicon
             sentiment, is not installed here, so a lexicon count stands in).
Each pair is shown in a seeded random order (y_a, y_b), the attribute margins are standardised over the pool, and
the features are the difference of the two (last human turn, reply) embeddings, reduced to their top principal
components (unsupervised, fitted on the whole pool) and scaled to max norm 1. The embedding model is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from collabalign.data.hh_rlhf import load_hh_rlhf
from collabalign.data.words import WORD

ATTRIBUTES = ("harmless", "length", "apology")
APOLOGY_WORDS = frozenset("sorry apologize apologise apologies apology unfortunately cannot can't won't shouldn't "
                          "unable refuse".split())


@dataclass
class Pool:
    """Items: features z (N, d), attribute margins (N, K); `w_attr` (d, K) when attrs = z @ w_attr exactly."""

    z: np.ndarray
    attrs: np.ndarray
    names: tuple[str, ...]
    w_attr: np.ndarray | None = None


def synthetic_pool(rng: np.random.Generator, items: int, d: int, k: int) -> Pool:
    """Gaussian items z ~ N(0, I/d), scaled to max norm 1, and K attributes exactly linear in z with unit variance
    (attrs = z_raw Q sqrt(d), Q orthonormal d x K), so BT's generating reward direction is known (spec §8.3 R3)."""
    z_raw = rng.standard_normal((items, d)) / np.sqrt(d)
    top = np.linalg.norm(z_raw, axis=1).max()
    q = np.linalg.qr(rng.standard_normal((d, k)))[0]
    w_attr = q * np.sqrt(d) * top
    z = z_raw / top
    return Pool(z, z @ w_attr, tuple(f"a{j}" for j in range(k)), w_attr)


def last_human_turn(prompt: str) -> str:
    """The text of the final "Human:" turn of an HH prompt (the whole prompt when there is none)."""
    cut = prompt.rfind("Human:")
    return prompt[cut + len("Human:"):].split("\n\nAssistant:")[0].strip() if cut >= 0 else prompt.strip()


def reply_attributes(reply: str, is_chosen: bool, n_tokens: int) -> np.ndarray:
    """(harmless, length, apology) of one reply, given its token count."""
    words = WORD.findall(reply.lower())
    return np.array([float(is_chosen), np.log1p(n_tokens), float(sum(w in APOLOGY_WORDS for w in words))])


def pair_attributes(pairs: list[tuple[str, str, str]], order: np.ndarray, token_count) -> np.ndarray:
    """Raw attribute margins attr(y_a) - attr(y_b), (N, 3), of (prompt, chosen, rejected) pairs shown as (chosen,
    rejected) where order == 0 and (rejected, chosen) where order == 1; token_count(text) -> int."""
    out = np.empty((len(pairs), len(ATTRIBUTES)))
    for k, (_, chosen, rejected) in enumerate(pairs):
        a_c = reply_attributes(chosen, True, token_count(chosen))
        a_r = reply_attributes(rejected, False, token_count(rejected))
        out[k] = a_c - a_r if order[k] == 0 else a_r - a_c
    return out


def hh_pool(path: str, n_pairs: int, seed: int, dim: int, token_count: Callable[[str], int],
            embed: Callable[[list[tuple[str, str]]], np.ndarray]) -> Pool:
    """A pool of n_pairs HH-RLHF pairs (a seeded subset, each shown in a seeded order); `embed` maps (first, second)
    text pairs to sentence embeddings (N, D), `token_count` gives a reply's length in tokens."""
    pairs = load_hh_rlhf(path, drop_invalid=True).pairs
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(pairs), size=min(n_pairs, len(pairs)), replace=False)
    triples = [(pairs[k].prompt, pairs[k].chosen, pairs[k].rejected) for k in chosen]
    order = rng.integers(2, size=len(triples))
    attrs = pair_attributes(triples, order, token_count)
    first = [(last_human_turn(p), c if o == 0 else r) for (p, c, r), o in zip(triples, order, strict=True)]
    second = [(last_human_turn(p), r if o == 0 else c) for (p, c, r), o in zip(triples, order, strict=True)]
    phi = embed(first + second)
    z = phi[: len(triples)] - phi[len(triples):]
    z = z - z.mean(0)
    _, _, vt = np.linalg.svd(z, full_matrices=False)
    z = z @ vt[:dim].T
    z /= np.linalg.norm(z, axis=1).max()
    std = attrs.std(0)
    return Pool(z, (attrs - attrs.mean(0)) / np.where(std > 0, std, 1.0), ATTRIBUTES)
