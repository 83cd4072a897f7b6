"""Teacher-forced log-probs of a policy whose only adapter sits on the LM head, from cached trunk states.

With LoRA on the LM head alone (the meta-reward paper trains "LoRA adapter + LM head"; on a CPU we keep only the
head), the frozen trunk's last hidden states of a fixed (prompt, response) set never change. They are computed once;
every later pass (SFT, reward-weighted MLE, DPO, the bilevel inner loop with its Hessian-vector products, preference
accuracy) costs one (H x V) product per response token, with the adapter factors as explicit arguments so the same
code serves plain training and differentiation through training. Sampling still goes through `Policy`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from collabalign.policy.model import Policy


@dataclass
class HeadCache:
    """N responses: `hidden` (N, T, H) is the trunk state each response token is predicted from, `targets` (N, T)
    the tokens, `mask` (N, T) the real ones (EOS included)."""

    hidden: Tensor
    targets: Tensor
    mask: Tensor

    def __len__(self) -> int:
        return self.hidden.shape[0]

    @property
    def lengths(self) -> Tensor:
        """|y| in tokens (N,), for length-normalised preference accuracy."""
        return self.mask.sum(1)


@torch.no_grad()
def cache_responses(policy: Policy, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 16,
                    chat: bool = True, max_prompt_tokens: int = 256) -> HeadCache:
    """One no-grad pass of the trunk over every (prompt, response ending in EOS), keeping the response positions."""
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"need as many prompts as responses, and some: {len(prompts)} vs {len(responses)}")
    hidden, targets = [], []
    for start in range(0, len(prompts), batch_size):
        r = policy.rollout(list(prompts[start:start + batch_size]), list(responses[start:start + batch_size]),
                           chat=chat, max_prompt_tokens=max_prompt_tokens)
        h = policy.trunk_states(r)
        h = h.to(torch.promote_types(h.dtype, torch.float32)).cpu()  # half-precision trunks are kept as float32
        for i, n in enumerate(r.mask.sum(1).tolist()):
            hidden.append(h[i, :n])
            targets.append(r.input_ids[i, r.prompt_len:r.prompt_len + n].cpu())
    masks = [torch.ones(len(t), dtype=torch.bool) for t in targets]
    return HeadCache(pad_sequence(hidden, batch_first=True), pad_sequence(targets, batch_first=True),
                     pad_sequence(masks, batch_first=True))


class HeadAdapter:
    """The policy's LM-head LoRA as a function of its factors θ = [A, B_V]: log π_θ(y|x) on one cache's states.

    B has rows only for the vocabulary V of the cached responses (every token they contain); the other rows of the
    policy's B stay zero. The logits of tokens outside V are then the base model's, so their share of the softmax is
    one number per position, computed once here, and a pass costs |V|·H per token instead of the full vocabulary's.
    `full_vocab=True` keeps every row (B_V = B)."""

    def __init__(self, policy: Policy, cache: HeadCache, full_vocab: bool = False, chunk: int = 64):
        head = policy.model.get_output_embeddings()
        if not policy.head_only:
            raise ValueError("HeadAdapter needs a policy whose only LoRA layer is its LM head "
                             "(build it with targets=('lm_head',))")
        self.policy, self.layer, self.cache = policy, head, cache
        weight = head.base.weight.detach()
        bias = None if head.base.bias is None else head.base.bias.detach()
        n_vocab = weight.shape[0]
        vocab = torch.arange(n_vocab) if full_vocab else torch.unique(cache.targets[cache.mask])
        self.vocab = vocab.to(weight.device)
        self.weight = weight[self.vocab]
        self.bias = None if bias is None else bias[self.vocab]
        self.local_targets = torch.searchsorted(vocab, cache.targets).clamp(max=len(vocab) - 1)
        others = torch.ones(n_vocab, dtype=torch.bool, device=weight.device)
        others[self.vocab] = False
        self.outside = torch.full(cache.targets.shape, float("-inf"), dtype=weight.dtype)
        if others.any():
            w_out, b_out = weight[others], None if bias is None else bias[others]
            with torch.no_grad():
                for start in range(0, len(cache), chunk):
                    z = cache.hidden[start:start + chunk].to(weight) @ w_out.T
                    self.outside[start:start + chunk] = (z if b_out is None else z + b_out).logsumexp(-1).cpu()
        self.others = others

    def params(self) -> list[Tensor]:
        """A copy of the current factors [A, B_V]; an error if the policy's B moved outside V."""
        B = self.layer.B.detach()
        if bool(B[self.others].any()):
            raise ValueError("the policy's LM-head adapter has rows outside the cached vocabulary; train it inside "
                             "HeadAdapter.only_vocab()")
        return [self.layer.A.detach().clone(), B[self.vocab].clone()]

    def load(self, theta: Sequence[Tensor]) -> None:
        """Writes factors θ into the policy (rows outside V zero), to sample from it or save it."""
        with torch.no_grad():
            self.layer.A.copy_(theta[0])
            self.layer.B.zero_()
            self.layer.B[self.vocab] = theta[1].to(self.layer.B)

    @contextmanager
    def only_vocab(self) -> Iterator[None]:
        """Within the block, gradients of the policy's B are zero outside V (for training through the policy, e.g.
        PPO: with Adam, rows that never get a gradient never move)."""
        keep = (~self.others).to(self.layer.B.dtype)[:, None]
        handle = self.layer.B.register_hook(lambda g: g * keep)
        try:
            yield
        finally:
            handle.remove()

    def token_logprobs(self, theta: Sequence[Tensor], rows: Tensor) -> Tensor:
        """log π_θ(y_t | x, y_<t) (n, t) for the cached responses at `rows`, t their longest length (the cache's
        padding past it is never computed), zero past each response's end."""
        t = int(self.cache.mask[rows].sum(1).max())
        h = self.cache.hidden[rows, :t].to(self.weight)
        logits = h @ self.weight.T + self.layer.scale * (h @ theta[0].T) @ theta[1].T
        if self.bias is not None:
            logits = logits + self.bias
        device = logits.device
        targets, mask = self.local_targets[rows, :t].to(device), self.cache.mask[rows, :t].to(device)
        normaliser = torch.logaddexp(logits.logsumexp(-1), self.outside[rows, :t].to(device))
        logprobs = logits.gather(-1, targets[..., None]).squeeze(-1) - normaliser
        return logprobs.masked_fill(~mask, 0.0)

    def logprobs(self, theta: Sequence[Tensor], rows: Tensor) -> Tensor:
        """Sequence log-probs log π_θ(y|x) (n,), summed over response tokens."""
        return self.token_logprobs(theta, rows).sum(1)
