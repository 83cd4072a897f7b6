"""One FIRM client step against one single-objective PPO step on the same minibatch, from one run.

Setup: SmolLM2-135M-Instruct with LoRA r = 16, alpha 32 on q, k, v, o (the paper's adapter), one rollout of 8
prompts x 32 sampled tokens scored by two fixed synthetic rewards, prepared once. A "step" is one minibatch
optimiser step of PPO:
- single objective: one shared forward, one backward of L^1, Adam step;
- FIRM (M = 2): one shared forward, M backward passes (objective_gradients), the Gram matrix, the regularised MGDA
  solve (β = 0.01, trace-normalised), the combined gradient written back, Adam step.
Goals: FIRM / single <= M + 0.1 = 2.1 (only the backward passes repeat), and the solve under 1% of the FIRM step.
Times are medians of interleaved calls (timing.compare), so the ratio is measured side by side.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/firm_step.py [--tiny]
"""

from __future__ import annotations

import sys

import torch
from timing import compare

from collabalign.methods.firm.federated import firm_weights
from collabalign.models.backbones import smollm2_135m, tiny_llama
from collabalign.policy import Policy, PPOConfig, objective_gradients, optimizers, ppo_losses, prepare, write_gradient

PROMPTS = ["How do I bake bread at home?", "Is it safe to mix bleach and vinegar?", "Write a haiku about rain.",
           "How can I get back at a coworker?", "What is the capital of Peru?", "Tell me how to pick a lock.",
           "Give me tips for a job interview.", "Why is the sky blue?"]


def main(tiny: bool) -> None:
    torch.manual_seed(0)
    backbone = tiny_llama() if tiny else smollm2_135m()
    policy = Policy(backbone, rank=16, alpha=32.0, dropout=0.05, objectives=2,
                    generator=torch.Generator().manual_seed(0))
    cfg = PPOConfig(minibatch=8)
    rollout = policy.generate(PROMPTS, 32, generator=torch.Generator().manual_seed(1))
    lengths = rollout.mask.sum(1).float()
    rewards = torch.stack([lengths / lengths.max(), 1 - lengths / lengths.max()], 1)
    batch = prepare(policy, rollout, rewards, 0.2, cfg)
    rows = torch.arange(len(PROMPTS))
    params = policy.adapter_params()
    actor, _ = optimizers(policy, cfg)
    solve = firm_weights(0.01, None)

    def single() -> None:
        losses, _, _ = ppo_losses(policy, batch, rows, cfg)
        actor.zero_grad(set_to_none=True)
        losses[0].backward()
        actor.step()

    def firm() -> None:
        losses, _, _ = ppo_losses(policy, batch, rows, cfg)
        actor.zero_grad(set_to_none=True)
        grads = objective_gradients(losses, params)
        write_gradient(params, grads @ solve(grads))
        actor.step()

    grads = objective_gradients(ppo_losses(policy, batch, rows, cfg)[0], params)
    times = compare({"single": single, "firm": firm, "solve": lambda: solve(grads)}, rounds=7, warmup=1)
    d = grads.shape[0]
    print(f"model {'tiny-llama' if tiny else 'SmolLM2-135M'}; adapter d = {d:,} floats; minibatch 8 x "
          f"({rollout.prompt_len} prompt + {rollout.mask.shape[1]} response) tokens")
    print(f"single-objective PPO step {times['single'] * 1e3:8.1f} ms")
    print(f"FIRM step (M = 2)         {times['firm'] * 1e3:8.1f} ms   ratio {times['firm'] / times['single']:.2f}x "
          f"(goal <= 2.1x)")
    print(f"MGDA solve (Gram + QP)    {times['solve'] * 1e3:8.3f} ms   {100 * times['solve'] / times['firm']:.2f}% "
          f"of the FIRM step (goal < 1%)")


if __name__ == "__main__":
    main("--tiny" in sys.argv)
