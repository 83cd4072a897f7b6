"""Real preference text for the AffPCL reward models (spec §8.3): HH-RLHF harmless pairs embedded by all-MiniLM-L6-v2,
with measurable attributes of each reply for simulated annotators.

Per reply y of a pair (prompt x, chosen, rejected), three attributes:
  harmless   1 if y is the dataset's `chosen` reply (the HH harmlessness label), else 0;
  length     log(1 + number of MiniLM word-piece tokens of y);
  apology    number of whole-word apology / refusal markers in y (APOLOGY_WORDS; VADER, the spec's lexicon
             sentiment, is not installed here, so a lexicon count stands in).
Each pair is shown in a seeded random order (y_a, y_b), the attribute margins attr(y_a) - attr(y_b) are
standardised over the pool, and the features are z = phi(x, y_a) - phi(x, y_b), with phi the mean-pooled, L2-normalised
MiniLM embedding of (last human turn, reply); z is reduced to its top principal components (unsupervised, fitted on
the whole pool) and scaled to max norm 1.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from collabalign.methods.affpcl.reward import Pool

ATTRIBUTES = ("harmless", "length", "apology")
APOLOGY_WORDS = frozenset("sorry apologize apologise apologies apology unfortunately cannot can't won't shouldn't "
                          "unable refuse".split())
_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def last_human_turn(prompt: str) -> str:
    """The text of the final "Human:" turn of an HH prompt (the whole prompt when there is none)."""
    cut = prompt.rfind("Human:")
    return prompt[cut + len("Human:"):].split("\n\nAssistant:")[0].strip() if cut >= 0 else prompt.strip()


def reply_attributes(reply: str, is_chosen: bool, n_tokens: int) -> np.ndarray:
    """(harmless, length, apology) of one reply, given its token count."""
    words = _WORD.findall(reply.lower())
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


def embed(texts: list[tuple[str, str]], backbone, batch: int = 64, max_length: int = 128) -> np.ndarray:
    """Mean-pooled, L2-normalised MiniLM sentence embeddings of (first, second) text pairs, (N, 384)."""
    import torch

    model, tok = backbone.model, backbone.tokenizer
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            chunk = texts[i: i + batch]
            enc = tok([a for a, _ in chunk], [b for _, b in chunk], truncation="longest_first",
                      max_length=max_length, padding=True, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    return np.concatenate(out).astype(float)


@lru_cache(maxsize=2)
def hh_pool(path: str, n_pairs: int, seed: int, dim: int, max_length: int = 64) -> Pool:
    """A pool of n_pairs HH-RLHF pairs (a seeded subset), encoded once per process (treat as read-only)."""
    import torch

    from collabalign.data.hh_rlhf import load_hh_rlhf
    from collabalign.models.backbones import minilm_l6

    pairs = load_hh_rlhf(path, drop_invalid=True).pairs
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(pairs), size=min(n_pairs, len(pairs)), replace=False)
    triples = [(pairs[k].prompt, pairs[k].chosen, pairs[k].rejected) for k in chosen]
    order = rng.integers(2, size=len(triples))
    backbone = minilm_l6()
    tok = backbone.tokenizer
    attrs = pair_attributes(triples, order, lambda text: len(tok(text, add_special_tokens=False)["input_ids"]))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = [(last_human_turn(p), c if o == 0 else r) for (p, c, r), o in zip(triples, order, strict=True)]
        second = [(last_human_turn(p), r if o == 0 else c) for (p, c, r), o in zip(triples, order, strict=True)]
        phi = embed(first + second, backbone, max_length=max_length)
    finally:
        torch.set_num_threads(threads)
    z = phi[: len(triples)] - phi[len(triples):]
    z = z - z.mean(0)
    _, _, vt = np.linalg.svd(z, full_matrices=False)
    z = z @ vt[:dim].T
    z /= np.linalg.norm(z, axis=1).max()
    std = attrs.std(0)
    return Pool(z, (attrs - attrs.mean(0)) / np.where(std > 0, std, 1.0), ATTRIBUTES)
