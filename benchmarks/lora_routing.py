"""Mixed-party batch through LoRALinear (per-party A and B, one pass) vs one shared adapter vs a per-party loop.

Forward + backward of a 384 -> 384 layer (MiniLM's width), rank 8, 256 samples x 32 tokens, the backward from a
fixed dense output gradient (as a loss gives; `.sum()`'s expanded ones cost a copy a real step does not make).
Goal (issue 17): per-party routing <= 1.1x the shared adapter at 100 parties.
Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lora_routing.py
"""

from __future__ import annotations

import torch
from timing import compare
from torch import nn

from collabalign.lora import LoRALinear

DIM, RANK, N, T = 384, 8, 256, 32
GRAD = torch.randn(N, T, DIM, generator=torch.Generator().manual_seed(1))


def step(layer: LoRALinear, x: torch.Tensor) -> None:
    layer.zero_grad(set_to_none=True)
    layer(x).backward(GRAD)


def time_parties(base: nn.Linear, shared: LoRALinear, x: torch.Tensor, parties: int) -> dict[str, float]:
    """Median seconds of the shared adapter, the routed per-party layer and a per-party loop."""
    routed = LoRALinear(base, RANK, parties_a=parties, parties_b=parties)
    party = torch.randint(0, parties, (N,))
    routed.route(party)
    groups = [(p, (party == p).nonzero().squeeze(1)) for p in range(parties)]
    loop = LoRALinear(base, RANK, parties_a=parties, parties_b=parties)

    def per_party_loop() -> None:
        loop.zero_grad(set_to_none=True)
        total = 0.0
        for p, rows in groups:
            if rows.numel():
                loop.route(p)
                total = total + (loop(x[rows]) * GRAD[rows]).sum()
        total.backward()

    return compare({"shared": lambda: step(shared, x), "routed": lambda: step(routed, x), "loop": per_party_loop})


def main() -> None:
    torch.manual_seed(0)
    base = nn.Linear(DIM, DIM)
    x = torch.randn(N, T, DIM)
    shared = LoRALinear(base, RANK)
    print(f"layer {DIM}->{DIM}, rank {RANK}, batch {N} x {T} tokens, forward+backward (median of 15, interleaved)")
    print(f"{'parties':>8} {'shared ms':>10} {'routed ms':>10} {'loop ms':>10} {'routed/shared':>14} "
          f"{'loop/shared':>12}")
    for parties in (1, 10, 100):
        t = time_parties(base, shared, x, parties)
        print(f"{parties:>8} {t['shared'] * 1e3:>10.2f} {t['routed'] * 1e3:>10.2f} {t['loop'] * 1e3:>10.2f} "
              f"{t['routed'] / t['shared']:>14.2f} {t['loop'] / t['shared']:>12.2f}")


if __name__ == "__main__":
    main()
