"""Forward + backward time of a rank-k slice relative to the full rank r, on a LoRA-dominated layer.

Layer 256 -> 256 with r = 256 (LoRA flops ~ 4x the frozen base), 4096 tokens; input needs no grad.
Goal: <= 0.35 at k/r = 1/8 (sliced compute, not masking).
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
    x = torch.randn(TOKENS, DIM)
    gen = torch.Generator().manual_seed(0)
    subsets = {f"{k}/{RANK}": torch.randperm(RANK, generator=gen)[:k].sort().values
               for k in (RANK // 8, RANK // 4, RANK // 2, RANK)}

    def step(idx: torch.Tensor) -> None:
        layer.zero_grad(set_to_none=True)
        layer.route(rank_idx=idx)
        layer(x).sum().backward()

    times = compare({name: (lambda i=idx: step(i)) for name, idx in subsets.items()})
    full = times[f"{RANK}/{RANK}"]
    print(f"layer {DIM}->{DIM}, r={RANK}, {TOKENS} tokens, forward+backward (median of 15, interleaved)")
    print(f"{'k/r':>8} {'ms':>8} {'ratio to k=r':>13}")
    for name, t in times.items():
        k = int(name.split("/")[0])
        print(f"{k / RANK:>8.3f} {t * 1e3:>8.2f} {t / full:>13.2f}")


if __name__ == "__main__":
    main()
