"""Direct preference optimisation (Rafailov et al. 2023), sigmoid loss, with the adapters-off model as reference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from collabalign.policy.model import Policy


def dpo_loss(pi_chosen: Tensor, pi_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float) -> tuple[Tensor, Tensor]:
    """Per-pair -log sigmoid(margin) and the implicit-reward margin beta((pi_c - ref_c) - (pi_r - ref_r)), from
    sequence log-probs (B,)."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    return -F.logsigmoid(margin), margin


def dpo_step(policy: Policy, opt: torch.optim.Optimizer, prompts: list[str], chosen: list[str], rejected: list[str],
             beta: float, chat: bool = True) -> dict[str, float]:
    """One step on the mean DPO loss; chosen and rejected go through one forward. Returns the loss, the mean
    chosen-minus-rejected implicit-reward margin and the fraction of pairs ranked right (before the step)."""
    n = len(prompts)
    rollout = policy.rollout(list(prompts) * 2, list(chosen) + list(rejected), chat=chat)
    logps = policy.token_logprobs(rollout).sum(1)
    ref = policy.token_logprobs(rollout, reference=True).sum(1)
    losses, margin = dpo_loss(logps[:n], logps[n:], ref[:n], ref[n:], beta)
    loss = losses.mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    margin = margin.detach()
    return {"loss": float(loss.detach()), "margin": float(margin.mean()),
            "accuracy": float((margin > 0).float().mean())}
