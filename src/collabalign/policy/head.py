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
    `full_vocab=True` keeps every row (B_V = B).

    Passes run on the response tokens only, packed (no padding), and when the base logits of every cached token over V
    fit in `base_logits_bytes` they are computed once too: a pass then adds only the adapter's rank-r term, |V|·r per
    token instead of |V|·H (benchmarks/meta_reward_head.py)."""

    def __init__(self, policy: Policy, cache: HeadCache, full_vocab: bool = False, chunk: int = 1024,
                 base_logits_bytes: int = 2**32):
        head = policy.model.get_output_embeddings()
        if not policy.head_only:
            raise ValueError("HeadAdapter needs a policy whose only LoRA layer is its LM head "
                             "(build it with targets=('lm_head',))")
        lengths = cache.mask.sum(1)
        if not torch.equal(cache.mask, torch.arange(cache.mask.shape[1])[None, :] < lengths[:, None]):
            raise ValueError("the cache's mask must mark each response's first tokens (as cache_responses builds it)")
        self.policy, self.layer, self.cache = policy, head, cache
        weight = head.base.weight.detach()
        bias = None if head.base.bias is None else head.base.bias.detach()
        n_vocab = weight.shape[0]
        vocab = torch.arange(n_vocab) if full_vocab else torch.unique(cache.targets[cache.mask])
        self.vocab = vocab.to(weight.device)
        self.weight = weight[self.vocab]
        self.bias = None if bias is None else bias[self.vocab]
        self.others = torch.ones(n_vocab, dtype=torch.bool, device=weight.device)
        self.others[self.vocab] = False
        # the response tokens packed row after row: row i's tokens are offsets[i] .. offsets[i] + lengths[i] - 1
        self.lengths, self.offsets = lengths, lengths.cumsum(0) - lengths
        self.hidden = cache.hidden[cache.mask]
        self.targets = torch.searchsorted(vocab, cache.targets[cache.mask]).clamp(max=len(vocab) - 1)
        store = len(self.hidden) * len(self.vocab) * self.weight.element_size() <= base_logits_bytes
        self.outside = torch.full((len(self.hidden),), float("-inf"), dtype=weight.dtype)
        self.base = torch.empty((len(self.hidden), len(self.vocab)), dtype=weight.dtype) if store else None
        w_out, b_out = weight[self.others], None if bias is None else bias[self.others]
        with torch.no_grad():
            for start in range(0, len(self.hidden), chunk):
                h = self.hidden[start:start + chunk].to(weight)
                if self.others.any():
                    z = h @ w_out.T
                    self.outside[start:start + chunk] = (z if b_out is None else z + b_out).logsumexp(-1).cpu()
                if store:
                    self.base[start:start + chunk] = self._base_logits(h).cpu()

    def _base_logits(self, h: Tensor) -> Tensor:
        """The frozen head's logits over V of trunk states h (..., H)."""
        logits = h @ self.weight.T
        return logits if self.bias is None else logits + self.bias

    def _tokens(self, rows: Tensor, width: int | None = None) -> tuple[Tensor, Tensor]:
        """The packed indices of the response tokens of `rows`, row after row, and the (n, width) mask they fill
        (width: the rows' longest length by default)."""
        lengths = self.lengths[rows]
        mask = torch.arange(width or int(lengths.max()))[None, :] < lengths[:, None]
        starts = torch.repeat_interleave(self.offsets[rows], lengths)
        first = torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
        return starts + torch.arange(len(starts)) - first, mask

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

    def _padded_logprobs(self, theta: Sequence[Tensor], rows: Tensor, width: int | None = None) -> Tensor:
        """log π_θ of the response tokens of `rows`, (n, width), zero past each response's end; only the response
        tokens are computed."""
        tokens, mask = self._tokens(rows, width)
        device = self.weight.device
        h = self.hidden[tokens].to(self.weight)
        base = self._base_logits(h) if self.base is None else self.base[tokens].to(device)
        logits = base + self.layer.scale * (h @ theta[0].T) @ theta[1].T
        normaliser = torch.logaddexp(logits.logsumexp(-1), self.outside[tokens].to(device))
        logprobs = logits.gather(-1, self.targets[tokens].to(device)[:, None]).squeeze(-1) - normaliser
        return logprobs.new_zeros(mask.shape).masked_scatter(mask.to(device), logprobs)

    def token_logprobs(self, theta: Sequence[Tensor], rows: Tensor) -> Tensor:
        """log π_θ(y_t | x, y_<t) (n, t) for the cached responses at `rows`, t their longest length, zero past each
        response's end."""
        return self._padded_logprobs(theta, rows)

    def logprobs(self, theta: Sequence[Tensor], rows: Tensor, chunk: int = 256) -> Tensor:
        """Sequence log-probs log π_θ(y|x) (n,), summed over the cache's full width: a row's value does not depend on
        the other rows of the call (a sum over the batch's longest length would round by that length), so a long
        list of rows is scored in chunks of `chunk` rows, bounding the (tokens x V) logits held at once."""
        width = self.cache.mask.shape[1]
        return torch.cat([self._padded_logprobs(theta, rows[i:i + chunk], width).sum(1)
                          for i in range(0, len(rows), chunk)])
