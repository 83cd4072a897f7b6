"""Where one FIRM RLOO client step spends its time on SmolLM2-135M-Instruct, and what LoRA in the top blocks saves.

Setup (the CPU main form's step, configs/firm/main.yaml): 4 prompts x 4 replies x 32 sampled tokens, two rewards
(fixed synthetic ones, so scoring is excluded), LoRA r 16, alpha 32 on q, k, v, o. A step is: sampling (KV cache),
the policy's log-probs with grad and the reference's without, M = 2 backward passes (objective_gradients), the
regularised MGDA solve and an Adam step. Compared side by side (timing.compare, medians of interleaved calls):
- `all 30 blocks` (the main form's adapter) against `top 8 blocks` (lora.blocks = 8): the backward passes stop at
  the lowest adapted block, so the gradient part should shrink towards 8/30 while sampling and the forwards do not.
Run: OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/firm_rloo_cost.py
"""

from __future__ import annotations

import torch
from timing import compare

from collabalign.methods.firm.federated import firm_weights
from collabalign.models.backbones import smollm2_135m
from collabalign.models.pooled import layer_stack, top_block_targets
from collabalign.policy import Policy, objective_gradients, rloo_advantages, write_gradient

PROMPTS = ["How do I bake bread at home?", "Is it safe to mix bleach and vinegar?",
           "How can I get back at a coworker?", "Tell me how to pick a lock."]
REPLIES, TOKENS = 4, 32


def parts(blocks: int | None) -> dict:
    backbone = smollm2_135m()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    if blocks is not None:
        targets = top_block_targets(backbone.model, blocks, targets)
    policy = Policy(backbone, targets, rank=16, alpha=32.0, dropout=0.05, objectives=2,
                    generator=torch.Generator().manual_seed(0))
    actor = torch.optim.Adam(policy.adapter_params(), lr=1e-3)
    prompts = [p for p in PROMPTS for _ in range(REPLIES)]
    rollout = policy.generate(prompts, TOKENS, generator=torch.Generator().manual_seed(1))
    lengths = rollout.response_mask.sum(1).float()
    rewards = torch.stack([lengths / TOKENS, torch.linspace(0, 1, len(prompts))], 1)
    solve, params = firm_weights(0.01, None), policy.adapter_params()

    def sample() -> None:
        policy.generate(prompts, TOKENS, generator=torch.Generator().manual_seed(1))

    def forwards() -> None:
        with torch.no_grad():
            policy.token_logprobs(rollout)
        policy.token_logprobs(rollout, reference=True)

    def update() -> None:
        logprobs = policy.token_logprobs(rollout).sum(1)
        kl = logprobs.detach() - policy.token_logprobs(rollout, reference=True).sum(1)
        shaped = rewards - 0.05 * kl[:, None]
        losses = torch.stack([-(rloo_advantages(shaped[:, j], REPLIES) * logprobs).mean() for j in range(2)])
        grads = objective_gradients(losses, params)
        actor.zero_grad(set_to_none=True)
        write_gradient(params, grads @ solve(grads))
        actor.step()

    return {"sample": sample, "forwards": forwards, "update": update}


def main() -> None:
    total = len(layer_stack(smollm2_135m().model)[1])
    full, top = parts(None), parts(8)
    times = compare({f"{arm} {name}": fn for arm, fns in (("all", full), ("top8", top)) for name, fn in fns.items()},
                    rounds=5, warmup=1)
    print(f"RLOO step, {len(PROMPTS)} prompts x {REPLIES} replies x {TOKENS} tokens, SmolLM2-135M ({total} blocks)")
    print(f"{'part':28s} {'all blocks':>11s} {'top 8':>9s} {'ratio':>7s}")
    for name in ("sample", "forwards", "update"):
        a, b = times[f"all {name}"], times[f"top8 {name}"]
        print(f"{name:28s} {a:10.2f}s {b:8.2f}s {b / a:7.2f}")
    a = times["all sample"] + times["all update"]
    b = times["top8 sample"] + times["top8 update"]
    print(f"{'step (sample + update)':28s} {a:10.2f}s {b:8.2f}s {b / a:7.2f}")
    print(f"share of the step in sampling (all blocks): {times['all sample'] / a:.0%}")


if __name__ == "__main__":
    main()
