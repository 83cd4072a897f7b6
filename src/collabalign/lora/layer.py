"""`LoRALinear`: a frozen linear map W0 plus ``scale * B @ A`` where each factor is shared or per-party.

- Shared factors: A (r, in), B (out, r). Per-party factors carry a leading party dimension:
  A (P, r, in), B (P, out, r). The forward routes each sample to its party's factors (one gather,
  one batched matmul), so a mixed-party batch is a single pass.
- Rows already grouped by party in equal blocks (`Blocks`) skip the gather: the party becomes the batch dimension
  of one matmul, much faster when there are many rows and small factors (the gather's backward is a serial scatter).
- A rank subset ``rank_idx`` (k indices) makes the forward use only A[idx], B[:, idx] with the r/k
  factor (scale alpha/r * r/k), so compute and gradients cost O(k): sliced, never masked.
- Per-party B may carry a per-party scale (`party_scale`, (P,)) in place of alpha / r: clients of different
  ranks and scales stacked into one layer (`lora.stacked`).
Routing is set on the layer (`route`) because Hugging Face forwards cannot carry extra arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Blocks:
    """Rows laid out as `repeats` runs of `parties` equal blocks: with n rows per block, row (j * parties + p) * n + t
    belongs to party p. Routing this instead of a per-row index tensor applies per-party factors blockwise."""

    parties: int
    repeats: int = 1


Party = Tensor | int | Blocks | None


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int, alpha: float | None = None, parties_a: int | None = None,
                 parties_b: int | None = None, dropout: float = 0.0):
        super().__init__()
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        self.rank = rank
        self.alpha = float(alpha if alpha is not None else rank)
        out_f, in_f = base.out_features, base.in_features
        shape_a = (rank, in_f) if parties_a is None else (parties_a, rank, in_f)
        shape_b = (out_f, rank) if parties_b is None else (parties_b, out_f, rank)
        w = base.weight
        self.A = nn.Parameter(torch.empty(shape_a, dtype=w.dtype, device=w.device))
        self.B = nn.Parameter(torch.zeros(shape_b, dtype=w.dtype, device=w.device))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.party: Party = None
        self.rank_idx: Tensor | None = None
        self.party_scale: Tensor | None = None  # (P,) with per-party B: each party's scale, used instead of `scale`
        self.enabled = True
        self.reset_parameters()

    @property
    def per_party_a(self) -> bool:
        return self.A.dim() == 3

    @property
    def per_party_b(self) -> bool:
        return self.B.dim() == 3

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """PEFT's default: A ~ kaiming-uniform(a=sqrt 5) (bound 1/sqrt(in)), B = 0, so the adapter starts at zero.
        A is drawn on the generator's device and copied over: the same draws on a GPU as on the CPU."""
        bound = 1.0 / math.sqrt(self.A.shape[-1])
        device = self.A.device if generator is None else generator.device
        with torch.no_grad():
            self.A.copy_(torch.empty(self.A.shape, dtype=self.A.dtype, device=device).uniform_(-bound, bound,
                                                                                               generator=generator))
            self.B.zero_()

    def set_factors(self, A: Tensor, B: Tensor, scale: float) -> None:
        """Replaces the shared factors by A (k, in), B (out, k) as new trainable parameters, with y = W0 x +
        scale * B A x: how a device trains a rank-k block it was sent (sketch, truncation or SVD factors)."""
        self.A = nn.Parameter(A.detach().to(self.base.weight.dtype, copy=True))  # never alias the caller's arrays
        self.B = nn.Parameter(B.detach().to(self.base.weight.dtype, copy=True))
        self.rank, self.rank_idx = A.shape[0], None
        self.alpha = float(scale) * self.rank

    def route(self, party: Party = None, rank_idx: Tensor | None = None) -> None:
        """Sets the per-sample party index (N,) or one party for the batch, and the active rank subset."""
        self.party = party
        self.rank_idx = rank_idx

    @property
    def active_rank(self) -> int:
        return self.rank if self.rank_idx is None else int(self.rank_idx.numel())

    @property
    def scale(self) -> float:
        """alpha / r for the full rank; alpha/r * r/k = alpha/k for a k-subset; 1 when B carries `party_scale`."""
        return 1.0 if self.party_scale is not None else self.alpha / self.active_rank

    def factors(self, party: Party = None) -> tuple[Tensor, Tensor]:
        """A and B as used by the forward: gathered for `party`, sliced to `rank_idx`.

        Per-party factors with a tensor `party` come back with a leading sample dimension (N, k, in) / (N, out, k);
        with `Blocks` they keep their party dimension (P, k, in) / (P, out, k).
        """
        idx = self.rank_idx
        A, B = self.A, self.B
        if self.party_scale is not None:
            B = B * self.party_scale.to(B.dtype)[:, None, None]
        if self.per_party_a:
            A = _gather(A, party, idx, rank_dim=1, name="A")
        elif idx is not None:
            A = A.index_select(0, idx)
        if self.per_party_b:
            B = _gather(B, party, idx, rank_dim=2, name="B")
        elif idx is not None:
            B = B.index_select(1, idx)
        return A, B

    def forward(self, x: Tensor) -> Tensor:
        """y = base(x) + scale * (x A^T) B^T, the update added into the base's output in place (computed on the
        flattened rows, so the output is no view), inside the second GEMM whenever B is shared (addmm_, also under
        per-party A); the scale multiplies nothing larger than the factors. Factors in another dtype than the base's
        (float32 on bfloat16): added."""
        if not self.enabled:
            return self.base(x)
        return self.add_update(x, self.base(x.reshape(-1, x.shape[-1])))

    def add_update(self, x: Tensor, y: Tensor) -> Tensor:
        """The forward from the base's output `y` (x's flattened rows, out), which it updates in place: how a frozen
        projection computed once (`models.last_token`'s cached keys and values) gets its adapter."""
        if not self.enabled:
            return y.reshape(*x.shape[:-1], -1)
        A, B = self.factors(self.party)
        x = self.dropout(x).to(A.dtype)  # float32 factors on a bfloat16 base: compute the update in float32
        blocks = isinstance(self.party, Blocks)
        h = _apply_blocks(x, A, self.party) if blocks else _apply(x, A)
        if B.dim() == 2 and y.dtype == A.dtype:
            return y.addmm_(h.reshape(-1, h.shape[-1]), B.T, alpha=self.scale).reshape(*x.shape[:-1], -1)
        delta = (_apply_blocks(h, B, self.party) if blocks else _apply(h, B)).reshape(-1, B.shape[-2])
        y = y.add_(delta, alpha=self.scale) if y.dtype == delta.dtype else y + (self.scale * delta).to(y.dtype)
        return y.reshape(*x.shape[:-1], -1)

    def delta_weight(self, party: int | None = None) -> Tensor:
        """scale * B @ A for one party (or the shared factors): what merging adds to W0."""
        A, B = self.factors(party)
        return self.scale * (B @ A)

    @torch.no_grad()
    def merge_(self, party: int | None = None) -> None:
        """Adds the adapter into W0 and zeroes B, leaving the layer's function unchanged."""
        self.base.weight += self.delta_weight(party).to(self.base.weight.dtype)
        if self.rank_idx is None:
            (self.B[party] if self.per_party_b else self.B).zero_()
        elif self.per_party_b:
            self.B[party][:, self.rank_idx] = 0
        else:
            self.B[:, self.rank_idx] = 0

    def extra_repr(self) -> str:
        return (f"rank={self.rank}, alpha={self.alpha}, A={tuple(self.A.shape)}, B={tuple(self.B.shape)}")


def _gather(w: Tensor, party: Party, idx: Tensor | None, rank_dim: int, name: str) -> Tensor:
    """Per-party factor w (P, ...) -> the rows for `party` (int or (N,) tensor), rank-sliced by idx."""
    if party is None:
        raise ValueError(f"LoRALinear has per-party {name} but no party was routed (call route(party=...))")
    if isinstance(party, Blocks):
        if w.shape[0] != party.parties:
            raise ValueError(f"{name} has {w.shape[0]} parties but the rows are in blocks of {party.parties}")
        return w if idx is None else w.index_select(rank_dim, idx)
    if isinstance(party, int) or party.dim() == 0:
        w = w[int(party)]
        return w if idx is None else w.index_select(rank_dim - 1, idx)
    party = party.to(w.device)
    if idx is None:
        return _TakeRows.apply(w, party)
    if rank_dim == 1:  # A: (P, r, in) -> (N, k, in)
        return w[party[:, None], idx[None, :]]
    return w[party[:, None, None], torch.arange(w.shape[1], device=w.device)[None, :, None], idx[None, None, :]]


class _TakeRows(torch.autograd.Function):
    """w.index_select(0, rows) whose backward sums the per-row gradients into w's rows from a contiguous source.

    The per-sample matmuls hand back the factors' gradients as transposed views; index_add_ from such a view is a
    strided scatter 5x slower than from contiguous memory, so the sum runs over the transpose, into a transposed
    buffer, when that is contiguous (measured in benchmarks/lora_routing.py: the gathers' backward was 9% of a step).
    """

    @staticmethod
    def forward(ctx, w: Tensor, rows: Tensor) -> Tensor:
        ctx.save_for_backward(rows)
        ctx.shape = w.shape
        return w.index_select(0, rows)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (rows,) = ctx.saved_tensors
        if grad.dim() == 3 and not grad.is_contiguous() and grad.transpose(1, 2).is_contiguous():
            p, a, b = ctx.shape
            return grad.new_zeros(p, b, a).index_add_(0, rows, grad.transpose(1, 2)).transpose(1, 2), None
        return grad.new_zeros(ctx.shape).index_add_(0, rows, grad.contiguous()), None


def _apply(x: Tensor, w: Tensor) -> Tensor:
    """x (..., in) @ w^T where w is (out, in) or per-sample (N, out, in) with x (N, ..., in)."""
    if w.dim() == 2:
        return x @ w.T
    n = x.shape[0]
    flat = x.reshape(n, -1, x.shape[-1])
    return torch.bmm(flat, w.transpose(1, 2)).reshape(*x.shape[:-1], w.shape[1])


def _apply_blocks(x: Tensor, w: Tensor, blocks: Blocks) -> Tensor:
    """x (N, ..., in) @ w^T with w shared (out, in) or per party (P, out, in) over rows laid out as `blocks`."""
    if w.dim() == 2:
        return x @ w.T
    grouped = x.reshape(blocks.repeats, blocks.parties, -1, x.shape[-1])
    return torch.einsum("jpti,poi->jpto", grouped, w).reshape(*x.shape[:-1], w.shape[1])
