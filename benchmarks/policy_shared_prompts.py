"""Sampling several responses per prompt on SmolLM2-135M-Instruct: 16 prompts x 12 samples (192 rows, 24 new tokens,
the meta-reward judge's shape: 16 prompts x 3 repetitions x 4 temperatures) with each distinct prompt read once and
its cache copied to its rows (`Policy.generate`), against every row reading its prompt (`shared_reads` switched off),
measured interleaved in one run; the same tokens either way. Print only.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/policy_shared_prompts.py
"""

from __future__ import annotations

import statistics
import time

import torch
from policy_generate import PROMPTS  # the script beside this one

from collabalign.models.backbones import smollm2_135m
from collabalign.policy import Policy, model

SAMPLES, NEW_TOKENS, ROUNDS = 12, 24, 3


def sample(policy: Policy, seed: int, shared: bool):
    original = model.shared_reads
    if not shared:
        model.shared_reads = lambda prompts: None
    try:
        return policy.generate(PROMPTS * SAMPLES, NEW_TOKENS, generator=torch.Generator().manual_seed(seed))
    finally:
        model.shared_reads = original


def main() -> None:
    policy = Policy(smollm2_135m(), generator=torch.Generator().manual_seed(0))
    same = sample(policy, 0, True).responses == sample(policy, 0, False).responses  # also the warm-up
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for r in range(ROUNDS):
        for shared in (True, False):
            start = time.perf_counter()
            sample(policy, r, shared)
            seconds[shared].append(time.perf_counter() - start)
    read_once, every_row = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(f"SmolLM2-135M-Instruct, {len(PROMPTS)} prompts x {SAMPLES} samples x {NEW_TOKENS} new tokens, torch threads "
          f"{torch.get_num_threads()}, median of {ROUNDS} interleaved rounds; same responses: {same}")
    print(f"  each prompt read once   {read_once:7.1f} s")
    print(f"  every row reads it      {every_row:7.1f} s")
    print(f"  speed-up: {every_row / read_once:.2f}x")


if __name__ == "__main__":
    main()
