"""Generation throughput of a `Policy` on SmolLM2-135M-Instruct: 16 prompts sampled as one batch (KV cache, left
padding) against the same 16 prompts one at a time, 32 new tokens each, measured interleaved in one run.
Throughput counts the response tokens actually emitted (rows may stop early at EOS). Print only.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/policy_generate.py
"""

from __future__ import annotations

import statistics
import time

import torch

from collabalign.models.backbones import smollm2_135m
from collabalign.policy import Policy

PROMPTS = ["What is the capital of France?", "Give me a tip for sleeping better.", "Write a haiku about rain.",
           "How do I boil an egg?", "Name three primary colours.", "What does a CPU do?",
           "Suggest a name for a cat.", "Why is the sky blue?", "Translate 'good morning' into Spanish.",
           "What is 12 times 7?", "Describe a forest in one sentence.", "How can I learn to juggle?",
           "What is photosynthesis?", "Recommend a board game for four people.", "Who wrote Hamlet?",
           "Explain recursion to a child."]
NEW_TOKENS, ROUNDS = 32, 3


def batched(policy: Policy, seed: int) -> int:
    rollout = policy.generate(PROMPTS, NEW_TOKENS, generator=torch.Generator().manual_seed(seed))
    return int(rollout.mask.sum())


def one_at_a_time(policy: Policy, seed: int) -> int:
    gen = torch.Generator().manual_seed(seed)
    return sum(int(policy.generate([p], NEW_TOKENS, generator=gen).mask.sum()) for p in PROMPTS)


def main() -> None:
    policy = Policy(smollm2_135m(), generator=torch.Generator().manual_seed(0))
    candidates = {"batched (16 prompts, one batch)": batched, "one prompt at a time": one_at_a_time}
    for fn in candidates.values():  # warm-up
        fn(policy, 0)
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for r in range(ROUNDS):
        for name, fn in candidates.items():
            start = time.perf_counter()
            tokens = fn(policy, r)
            rates[name].append(tokens / (time.perf_counter() - start))
    print(f"SmolLM2-135M-Instruct + LoRA, {len(PROMPTS)} prompts x {NEW_TOKENS} new tokens, torch threads "
          f"{torch.get_num_threads()}, median of {ROUNDS} interleaved rounds")
    medians = {name: statistics.median(v) for name, v in rates.items()}
    for name, rate in medians.items():
        print(f"  {name:34s} {rate:8.1f} tokens/s")
    ratio = medians["batched (16 prompts, one batch)"] / medians["one prompt at a time"]
    print(f"  batched / one at a time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
