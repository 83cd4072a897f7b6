"""Cost of the meta-reward hypergradient against the number of inner steps D, from one run.

Setup: SmolLM2-135M-Instruct with LoRA r = 8 on its LM head over cached trunk states, full vocabulary (the costly case),
32 review-like responses of about 28 tokens, a linear reward on 16 random features, B_in = 8, 8 outer pairs. One
call = D inner SGD steps of reward-weighted MLE, then the reverse pass (one double backward per step: a
Hessian-vector product and the step's φ-gradient), keeping θ_0..θ_D but no unrolled graph. The same is timed on the
log-linear bandit of Variant A (d_θ = 12, d_φ = 12, B_in = 32) for the small-problem overheads.
Goal: cost linear in D within 10% for D = 5, 10, 20, 40: the times lie within 10% of their least-squares line
a + b·D (a is the fixed cost of the outer loss and its gradient, b the cost per inner step forward and back), so
time(D) / time(5) follows (a + b·D) / (a + 5b); the raw ratio to D = 5 is printed beside D / 5.
Times are medians of interleaved calls (timing.compare), so the ratios are measured side by side. Every inner step
uses the same batch of rows: a step's cost depends on which rows it holds (0.8 to 1.3 s here), so with batches drawn
per D the content, not D, decided the ratios (D = 40 once read 25% above linear on costlier draws).
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/meta_reward_hypergrad.py
     [--tiny]
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from timing import compare

from collabalign.methods.meta_reward.bilevel import hypergradient, pl_loss, reward_weights
from collabalign.models.backbones import smollm2_135m, tiny_llama
from collabalign.policy import Policy
from collabalign.policy.head import HeadAdapter, cache_responses

DS = (5, 10, 20, 40)
WORDS = ("great works well love it broke awful cheap sturdy easy returned perfect flimsy recommend never again "
         "beautiful useless bright quiet loud heavy light sharp dull fast slow").split()


def lm_problem(tiny: bool):
    backbone = tiny_llama() if tiny else smollm2_135m()
    policy = Policy(backbone, targets=("lm_head",), rank=8, alpha=16.0, dropout=0.0,
                    generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(1)
    responses = [" ".join(WORDS[i] for i in torch.randint(len(WORDS), (20,), generator=gen).tolist())
                 for _ in range(32)]
    cache = cache_responses(policy, ["Continue this kitchen product review, which begins: \"I bought\""] * 32,
                            responses)
    head = HeadAdapter(policy, cache, full_vocab=True)  # the full 49,152-token softmax: the costly case
    features = torch.randn(32, 16, generator=gen, dtype=torch.float64)

    def objective(theta, phi, rows):
        logprobs = head.logprobs(theta, rows)
        return (reward_weights(features[rows] @ phi[0], 1.0, "batch").to(logprobs) * logprobs).mean()

    def outer(theta, pairs):
        lp = head.logprobs(theta, torch.cat(pairs))
        return pl_loss(lp[:8], lp[8:]).mean()

    theta0 = [t + 1e-3 * torch.randn(t.shape, generator=gen) for t in head.params()]
    pairs = (torch.arange(8), torch.arange(8, 16))
    return objective, outer, theta0, [torch.zeros(16, dtype=torch.float64)], pairs, 3e-3, cache


def bandit_problem():
    gen = torch.Generator().manual_seed(0)
    F = torch.randn(200, 8, 12, generator=gen, dtype=torch.float64)

    def logp(theta, idx, y):
        return (F[idx] @ theta[0]).log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)

    def objective(theta, phi, batch):
        idx, y = batch
        r = F[idx, y] @ phi[0]
        return (reward_weights(r, 1.0) * logp(theta, idx, y)).mean() - 0.005 * (theta[0] ** 2).sum()

    def outer(theta, pairs):
        idx, a, b = pairs
        return pl_loss(logp(theta, idx, a), logp(theta, idx, b)).mean()

    pairs = (torch.arange(32), torch.randint(8, (32,), generator=gen), torch.randint(8, (32,), generator=gen))
    return objective, outer, [torch.zeros(12, dtype=torch.float64)], [0.1 * torch.randn(12, generator=gen,
                                                                                         dtype=torch.float64)], pairs


def report(name: str, times: dict[str, float]) -> None:
    base = times["D=5"]
    t = np.array([times[f"D={d}"] for d in DS])
    b, a = np.polyfit(np.array(DS, dtype=float), t, 1)
    print(f"{name}: fixed a = {a * 1e3:.1f} ms, per inner step b = {b * 1e3:.1f} ms (forward, backward, HVP)")
    for d, td in zip(DS, t, strict=True):
        line = a + b * d
        print(f"  D = {d:2d}: {td * 1e3:9.1f} ms   time / time(D=5) = {td / base:5.2f} (D / 5 = {d / 5:3.1f})   "
              f"off the line a + b·D by {100 * (td / line - 1):+5.1f}% (goal within ±10%)")


def main(tiny: bool) -> None:
    torch.manual_seed(0)
    objective, outer, theta0, phi, pairs, alpha, cache = lm_problem(tiny)
    gen = torch.Generator().manual_seed(2)
    batch = torch.randint(32, (8,), generator=gen)
    batches = {d: [batch] * d for d in DS}  # one batch at every step: D alone differs, not the rows' content
    lm = compare({f"D={d}": (lambda d=d: hypergradient(objective, outer, theta0, phi, batches[d], pairs, alpha))
                  for d in DS}, rounds=3, warmup=1)
    d_theta = sum(t.numel() for t in theta0)
    print(f"model {'tiny-llama' if tiny else 'SmolLM2-135M'}, LoRA on the LM head: d_θ = {d_theta:,}; responses "
          f"{cache.hidden.shape[1]} tokens max; θ_0..θ_D kept: {(max(DS) + 1) * d_theta * 4 / 2**20:.1f} MiB at "
          f"D = {max(DS)}")
    report("LM-head policy (B_in = 8)", lm)
    objective, outer, theta0, phi, pairs = bandit_problem()
    pairs_b = [(torch.randint(200, (32,), generator=gen), torch.randint(8, (32,), generator=gen))
               for _ in range(max(DS))]
    bb = {d: pairs_b[:d] for d in DS}
    bandit = compare({f"D={d}": (lambda d=d: hypergradient(objective, outer, theta0, phi, bb[d], pairs, 0.3))
                      for d in DS}, rounds=15, warmup=2)
    report("log-linear bandit (B_in = 32)", bandit)


if __name__ == "__main__":
    main("--tiny" in sys.argv)
