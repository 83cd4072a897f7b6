"""`Rollout`: prompts and responses as one token batch (prompt left-padded, response right-padded) with its masks."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rollout:
    """B prompt/response pairs: `input_ids` (B, P+T) is each prompt left-padded to P then its response right-padded to
    T; `attention_mask` marks real tokens, `response_mask` (bool) the response ones (EOS included when emitted).
    `trunk` (B, T, H), when set by `Policy.with_trunk`, holds the frozen trunk's last hidden states that predict each
    response token, so a policy whose only adapter is on its LM head never runs the trunk on this batch again."""

    prompts: list[str]
    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    prompt_len: int
    responses: list[str]
    trunk: Tensor | None = None

    def __len__(self) -> int:
        """B, the number of prompt/response pairs."""
        return len(self.prompts)

    @property
    def mask(self) -> Tensor:
        """(B, T) response-token mask, aligned with `Policy.token_logprobs`."""
        return self.response_mask[:, self.prompt_len:]

    @classmethod
    def build(cls, prompts: list[str], prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor,
              response_mask: Tensor, responses: list[str]) -> Rollout:
        """Joins left-padded prompts (B, P) and right-padded responses (B, T) with their masks."""
        return cls(list(prompts), torch.cat([prompt_ids, response_ids], 1),
                   torch.cat([prompt_mask, response_mask.long()], 1),
                   torch.cat([torch.zeros_like(prompt_mask, dtype=torch.bool), response_mask], 1),
                   prompt_ids.shape[1], list(responses))

    def select(self, rows: Tensor) -> Rollout:
        """The sub-batch at `rows` (a minibatch), with the same P and T."""
        idx = rows.tolist()
        return Rollout([self.prompts[i] for i in idx], self.input_ids[rows], self.attention_mask[rows],
                       self.response_mask[rows], self.prompt_len, [self.responses[i] for i in idx],
                       None if self.trunk is None else self.trunk[rows])
