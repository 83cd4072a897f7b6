"""Supervised fine-tuning and DPO of a LoRA policy as a `LocalTrainer` (methods/fedavg.py), so FedAvg and every server
optimiser (FedProx and SCAFFOLD included) train policies as they train reward models.

- SFT: the mean negative log-likelihood per token of the chosen replies given their prompts.
- DPO (Rafailov et al. 2023): the sigmoid loss of beta((log pi_c - log pi_ref_c) - (log pi_r - log pi_ref_r)) with
  the adapters-off model as reference, whose log-probs are computed once when the pairs are encoded.

Pairs are encoded once (`encode_policy_pairs`): replies cut at `max_response_tokens`, and, when the LM head is the
only adapted layer, the frozen trunk's states cached, so a step costs only the head (`Policy.with_trunk`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from collabalign.comm import Params
from collabalign.data.preferences import PreferencePair
from collabalign.lora.inject import lora_parameters
from collabalign.methods.drift import Correction
from collabalign.policy.dpo import dpo_loss
from collabalign.policy.model import Policy
from collabalign.policy.rollout import Rollout
from collabalign.seeding import Seeds

Objective = Literal["sft", "dpo"]


@dataclass
class PolicyPairs:
    """n pairs as rollouts of their chosen and rejected replies (rejected None for SFT), each with its reference
    log-prob sum (n,), and the policy's base log-prob rankings at encoding (the adapters-off model)."""

    chosen: Rollout
    rejected: Rollout | None
    ref_chosen: Tensor
    ref_rejected: Tensor | None

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, rows: Tensor | np.ndarray) -> PolicyPairs:
        rows = torch.as_tensor(rows, dtype=torch.long)
        rejected = None if self.rejected is None else _trim(self.rejected.select(rows))
        return PolicyPairs(_trim(self.chosen.select(rows)), rejected, self.ref_chosen[rows],
                           None if self.ref_rejected is None else self.ref_rejected[rows])


def _trim(rollout: Rollout) -> Rollout:
    """The rollout without the padding columns none of its rows uses (prompt on the left, response on the right)."""
    used = rollout.attention_mask.bool().any(0)
    first = min(int(used[:rollout.prompt_len].float().argmax()), rollout.prompt_len - 1)
    last = rollout.prompt_len + int(rollout.response_mask[:, rollout.prompt_len:].any(0).nonzero().max()) + 1
    trunk = None if rollout.trunk is None else rollout.trunk[:, :last - rollout.prompt_len]
    return Rollout(rollout.prompts, rollout.input_ids[:, first:last], rollout.attention_mask[:, first:last],
                   rollout.response_mask[:, first:last], rollout.prompt_len - first, rollout.responses, trunk)


def encode_policy_pairs(policy: Policy, pairs: Sequence[PreferencePair], objective: Objective,
                        max_prompt_tokens: int, max_response_tokens: int, chunk: int = 16) -> PolicyPairs:
    """The pairs' replies (only the chosen for SFT) as rollouts after their prompts, cut at `max_response_tokens`
    tokens (a cut reply has no EOS); with a head-only policy the trunk states are cached. A prompt over
    `max_prompt_tokens` is a ValueError naming its pair."""
    prompts = [p.prompt for p in pairs]
    sides = [[p.chosen for p in pairs]] + ([[p.rejected for p in pairs]] if objective == "dpo" else [])
    encoded = [_replies(policy, prompts, replies, max_prompt_tokens, max_response_tokens, chunk) for replies in sides]
    return PolicyPairs(encoded[0][0], encoded[1][0] if len(encoded) > 1 else None, encoded[0][1],
                       encoded[1][1] if len(encoded) > 1 else None)


def _replies(policy: Policy, prompts: list[str], replies: list[str], max_prompt_tokens: int, max_tokens: int,
             chunk: int) -> tuple[Rollout, Tensor]:
    """One rollout of every (prompt, reply), padded to the longest, and each reply's reference log-prob sum."""
    pieces, refs = [], []
    for s in range(0, len(prompts), chunk):
        try:
            rollout = policy.rollout(prompts[s:s + chunk], replies[s:s + chunk], max_prompt_tokens=max_prompt_tokens,
                                     max_response_tokens=max_tokens)
        except ValueError as error:
            raise ValueError(f"pairs {s}-{min(s + chunk, len(prompts)) - 1}: {error}") from None
        if policy.head_only:
            rollout = policy.with_trunk(rollout)
        refs.append(policy.token_logprobs(rollout, reference=True).sum(1))
        pieces.append(rollout)
    return _join(pieces, policy.pad_id), torch.cat(refs)


def _join(pieces: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of different prompt and response widths as one: prompts left-padded, responses right-padded."""
    p = max(r.prompt_len for r in pieces)
    t = max(r.input_ids.shape[1] - r.prompt_len for r in pieces)

    def widen(x: Tensor, r: Rollout, value) -> Tensor:
        left = x.new_full((len(r), p - r.prompt_len, *x.shape[2:]), value)
        right = x.new_full((len(r), t - (x.shape[1] - r.prompt_len), *x.shape[2:]), value)
        return torch.cat([left, x, right], 1)

    trunk = None
    if pieces[0].trunk is not None:
        trunk = torch.cat([torch.cat([r.trunk, r.trunk.new_zeros(len(r), t - r.trunk.shape[1], r.trunk.shape[2])], 1)
                           for r in pieces])
    return Rollout([x for r in pieces for x in r.prompts], torch.cat([widen(r.input_ids, r, pad_id) for r in pieces]),
                   torch.cat([widen(r.attention_mask, r, 0) for r in pieces]),
                   torch.cat([widen(r.response_mask, r, False) for r in pieces]), p,
                   [x for r in pieces for x in r.responses], trunk)


class PolicyTrainer:
    """`steps` AdamW steps (fresh each call) on minibatches of `batch_size` pairs drawn without replacement, epoch
    after epoch, on the SFT or DPO loss; only the LoRA factors train. `evaluate`: SFT's held-out NLL per token, or DPO's
    held-out preference accuracy (implicit reward margin above 0; ties count half), its own ranking's accuracy (the
    chosen reply's log-prob sum above the rejected's, as `base_ranking_accuracy` scores the base model) and loss."""

    def __init__(self, policy: Policy, objective: Objective, test: PolicyPairs, lr: float, steps: int,
                 batch_size: int, beta: float = 0.1, eval_batch_size: int = 32):
        self.policy, self.objective, self.test = policy, objective, test
        self.lr, self.steps, self.batch_size, self.beta = lr, steps, batch_size, beta
        self.eval_batch_size = eval_batch_size

    def trainable(self) -> dict[str, Tensor]:
        return lora_parameters(self.policy.model)

    def initial_params(self, seeds: Seeds) -> Params:
        """Fresh adapters (A from `seeds`, B = 0): the policy starts as its reference."""
        self.policy.reset_adapters(seeds.torch("policy-init"))
        return self.policy.adapter_state()

    def loss(self, batch: PolicyPairs) -> tuple[Tensor, Tensor]:
        """(the mean loss, per-pair scores): SFT's NLL per token and each reply's NLL; DPO's loss and each margin."""
        logps = self.policy.token_logprobs(batch.chosen)
        if self.objective == "sft":
            tokens = batch.chosen.mask.sum(1).clamp(min=1)
            return -logps.sum() / tokens.sum(), -logps.sum(1) / tokens
        rejected = self.policy.token_logprobs(batch.rejected).sum(1)
        losses, margin = dpo_loss(logps.sum(1), rejected, batch.ref_chosen, batch.ref_rejected, self.beta)
        return losses.mean(), margin

    def train(self, params: Params, data: PolicyPairs, rng: torch.Generator,
              correction: Correction | None = None) -> tuple[Params, int]:
        """AdamW from `params` on `data`; `correction` (FedProx, SCAFFOLD) amends each step's gradients."""
        self.policy.load_adapter_state(params)
        trainable = self.trainable()
        optimizer = torch.optim.AdamW(trainable.values(), lr=self.lr, weight_decay=0.0)
        order, at = torch.randperm(len(data), generator=rng), 0
        for _ in range(self.steps):
            if at >= len(data):
                order, at = torch.randperm(len(data), generator=rng), 0
            rows, at = order[at:at + self.batch_size], at + self.batch_size
            loss, _ = self.loss(data[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if correction is not None:
                correction.apply(trainable)
            optimizer.step()
        return self.policy.adapter_state(), len(data)

    @torch.no_grad()
    def scores(self, params: Params, data: PolicyPairs | None = None) -> Tensor:
        """Per pair of `data` (default: the held-out set): SFT's NLL per token of the chosen reply, DPO's margin."""
        self.policy.load_adapter_state(params)
        data = self.test if data is None else data
        return torch.cat([self.loss(data[torch.arange(s, min(s + self.eval_batch_size, len(data)))])[1]
                          for s in range(0, len(data), self.eval_batch_size)])

    def evaluate(self, params: Params) -> dict[str, float]:
        return self.summary(self.scores(params))

    def summary(self, scores: Tensor) -> dict[str, float]:
        """The held-out metrics from `scores` of the held-out set: SFT's NLL per token; DPO's implicit-reward
        accuracy, the policy's own ranking and the loss."""
        if self.objective == "sft":
            tokens = self.test.chosen.mask.sum(1).clamp(min=1).double()
            return {"nll": float((scores.double() * tokens).sum() / tokens.sum())}
        ranking = _above_zero(self.test.ref_chosen - self.test.ref_rejected + scores / self.beta)
        return {"accuracy": _above_zero(scores), "ranking": ranking,
                "loss": float(-torch.nn.functional.logsigmoid(scores).mean())}


def base_ranking_accuracy(pairs: PolicyPairs) -> float:
    """How often the reference (base) model gives the chosen reply the higher log-prob sum (ties count half): the
    base model's own preference accuracy, which the trained policy's `ranking` is compared with."""
    return _above_zero(pairs.ref_chosen - pairs.ref_rejected)


def _above_zero(diff: Tensor) -> float:
    """The share of entries above 0, ties counting half."""
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())
