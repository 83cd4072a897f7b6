"""HH-RLHF item pools for the reward-model part, embedded once per process by all-MiniLM-L6-v2 (mean-pooled,
L2-normalised embeddings of (last human turn, reply))."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from collabalign.data.annotator_pools import Pool, hh_pool


@lru_cache(maxsize=2)
def minilm_hh_pool(path: str, n_pairs: int, seed: int, dim: int, max_length: int = 64) -> Pool:
    """`hh_pool` with MiniLM token counts and embeddings, built once per process (treat as read-only)."""
    import torch

    from collabalign.models.backbones import minilm_l6

    backbone = minilm_l6()
    tok = backbone.tokenizer

    def encode(texts: list[tuple[str, str]]) -> np.ndarray:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return embed(texts, backbone, max_length=max_length)
        finally:
            torch.set_num_threads(threads)

    return hh_pool(path, n_pairs, seed, dim, lambda text: len(tok(text, add_special_tokens=False)["input_ids"]),
                   encode)


def embed(texts: list[tuple[str, str]], backbone, batch: int = 64, max_length: int = 128) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence embeddings of (first, second) text pairs, (N, hidden)."""
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
