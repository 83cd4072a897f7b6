"""Forward + backward time of a rank-k slice against its floor, on a LoRA-dominated layer.

Layer 256 -> 256 with r = 256 (LoRA flops ~ 4x the frozen base), 4096 tokens; the input needs no grad, the backward
starts from a fixed dense output gradient. The floor of a rank-k step is the frozen base's forward plus k/r of the
full-rank LoRA time (full step minus base), all measured in the same run, interleaved.
Goal (issue 17): every sliced step within 1.1x of its floor (sliced compute, not masking).
Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lora_slicing.py
"""

from __future__ import annotations

import torch
from timing import compare
from torch import nn

from collabalign.lora import LoRALinear

DIM, RANK, TOKENS = 256, 256, 4096


def main() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(nn.Linear(DIM, DIM), RANK)
    x, grad = torch.randn(TOKENS, DIM), torch.randn(TOKENS, DIM)
    gen = torch.Generator().manual_seed(0)
    subsets = {k: torch.randperm(RANK, generator=gen)[:k].sort().values for k in (RANK // 8, RANK // 4, RANK // 2)}

    def step(idx: torch.Tensor | None) -> None:
        layer.zero_grad(set_to_none=True)
        layer.route(rank_idx=idx)
        layer(x).backward(grad)

    candidates = {k: (lambda i=idx: step(i)) for k, idx in subsets.items()}
    times = compare({"base": lambda: layer.base(x), RANK: lambda: step(None), **candidates})
    base, full = times["base"], times[RANK]
    print(f"layer {DIM}->{DIM}, r={RANK}, {TOKENS} tokens, forward+backward (median of 15, interleaved); "
          f"frozen base forward {base * 1e3:.2f} ms, full-rank step {full * 1e3:.2f} ms")
    print(f"{'k/r':>8} {'ms':>8} {'floor ms':>9} {'x floor':>8} {'ratio to k=r':>13}")
    for k in subsets:
        floor = base + k / RANK * (full - base)
        print(f"{k / RANK:>8.3f} {times[k] * 1e3:>8.2f} {floor * 1e3:>9.2f} {times[k] / floor:>8.2f} "
              f"{times[k] / full:>13.2f}")


if __name__ == "__main__":
    main()
