"""Cost of one LM-head pass of the meta-reward task (`HeadAdapter.token_logprobs`), as the sentiment cell calls it:
the previous padded pass (every row padded to the batch's longest response, the frozen head's logits recomputed
each pass) against the packed pass (response tokens only) with the frozen logits over V computed per pass or stored
once (the default when they fit in `base_logits_bytes`).

Setup: SmolLM2-135M-Instruct with LoRA r = 8 on its LM head, the trunk states of 150 real fine-tuning reviews and
every pair response of two Amazon domains (kitchen, books; 2 opening words, 20 response words, as `meta_reward/main`),
a cached vocabulary V of a few thousand tokens. Rows: 16 (an inner or SFT step, forward and backward) and 128 (one
A_PL chunk of 64 pairs, forward only). Times are medians of interleaved calls (timing.compare); the three give the
same log-probs (printed), so only their cost differs.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/meta_reward_head.py
"""

from __future__ import annotations

import torch
from timing import compare

from collabalign.data.amazon_reviews import AMAZON_DIR, load_task
from collabalign.data.paths import shared_data_dir
from collabalign.models.backbones import smollm2_135m
from collabalign.policy import Policy
from collabalign.policy.head import HeadAdapter, cache_responses


def padded_logprobs(head: HeadAdapter, theta: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """The previous pass: rows padded to the longest, the frozen head's H x V product recomputed every call."""
    cache = head.cache
    t = int(cache.mask[rows].sum(1).max())
    h = cache.hidden[rows, :t]
    logits = h @ head.weight.T + head.layer.scale * (h @ theta[0].T) @ theta[1].T
    outside = torch.full(cache.targets.shape, float("-inf"))
    outside[cache.mask] = head.outside
    targets = torch.zeros(cache.targets.shape, dtype=torch.long)
    targets[cache.mask] = head.targets
    normaliser = torch.logaddexp(logits.logsumexp(-1), outside[rows, :t])
    logprobs = logits.gather(-1, targets[rows, :t, None]).squeeze(-1) - normaliser
    return logprobs.masked_fill(~cache.mask[rows, :t], 0.0)


def call(f, theta: list[torch.Tensor], rows: torch.Tensor, backward: bool):
    """One pass of `f`: forward only, or forward and the gradient in θ (a training step's work)."""
    if not backward:
        with torch.no_grad():
            return f(theta, rows)
    th = [t.clone().requires_grad_(True) for t in theta]
    return torch.autograd.grad(f(th, rows).sum(), th)


def main() -> None:
    domains = load_task(shared_data_dir() / AMAZON_DIR, ["kitchen", "books"], 2, 20, seed=0, max_examples=150)
    texts = list(dict.fromkeys((e.prompt, e.response) for d in domains.values() for e in d.examples))
    policy = Policy(smollm2_135m(), targets=("lm_head",), rank=8, alpha=16.0, dropout=0.0,
                    generator=torch.Generator().manual_seed(0))
    cache = cache_responses(policy, [p for p, _ in texts], [r for _, r in texts])
    stored, computed = HeadAdapter(policy, cache), HeadAdapter(policy, cache, base_logits_bytes=0)
    gen = torch.Generator().manual_seed(1)
    theta = [t + 0.05 * torch.randn(t.shape, generator=gen) for t in stored.params()]
    print(f"{len(cache)} responses, {int(cache.lengths.sum())} tokens ({cache.hidden.shape[1]} padded per row), "
          f"|V| = {len(stored.vocab)}; stored base logits {stored.base.numel() * 4 / 2**20:.0f} MiB")
    passes = {"padded": lambda th, r: padded_logprobs(stored, th, r), "packed": computed.token_logprobs,
              "packed, stored base": stored.token_logprobs}
    for n, backward in ((16, True), (128, False)):
        rows = torch.randperm(len(cache), generator=gen)[:n]
        outputs = [f(theta, rows) for f in passes.values()]
        gap = max(float((o - outputs[0]).abs().max()) for o in outputs)

        times = compare({name: (lambda f=f, r=rows, b=backward: call(f, theta, r, b)) for name, f in passes.items()},
                        rounds=9, warmup=1)
        print(f"{n} rows, {'forward and backward' if backward else 'forward'} (largest log-prob gap {gap:.1e}):")
        for name, s in times.items():
            print(f"  {name:20s} {s * 1e3:8.1f} ms   x{times['padded'] / s:5.1f} faster than padded")


if __name__ == "__main__":
    main()
