"""One training epoch of P-ShareLoRA (shared B, per-user A) with mixed-user batches routed in ONE forward pass, vs
a per-user loop over the same batches (one forward per user present), vs LoRA-global on the same data.

Reward model: a per-token MLP 128 -> 128 -> 128 (tanh) with LoRA rank 8 on both maps, mean-pooled over the tokens
of each text, frozen scalar head; batch 64 pairs, Adam. Texts of 16 tokens (LoRA on Q/K of a text model acts per
token) and, as the worst case, of one token (the per-sample factor gather is then not amortised over tokens).
Goal (issue 17): mixed-user batching <= 1.1x LoRA-global at N = 100 users (an earlier goal was 1.3x).
Second table: full-batch steps on the bilinear problem of docs/methods/pshare-lora.md §8.1 (rows sorted by user),
routed row by row (per-sample gather) vs in party blocks (`Blocks`: one batched matmul), for P-ShareLoRA and the full
per-user matrices.
Run: OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/pshare_batching.py
"""

from __future__ import annotations

import torch
from timing import compare
from torch import nn

from collabalign.experiments.pshare_lora.problems.synthetic import ProblemConfig, generate, model_for
from collabalign.lora import inject_lora, lora_layers, routed
from collabalign.methods.pshare_lora import Prefs, configure, pair_loss, prepare
from collabalign.models.reward import bt_loss

DIM, HIDDEN, RANK, PAIRS, BATCH = 128, 128, 8, 512, 64


class RewardMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                 nn.Linear(HIDDEN, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (n, tokens, DIM) -> rewards (n,): the head on the mean over tokens."""
        return self.net(x).mean(1).squeeze(-1)


def model(users: int | None) -> tuple[RewardMLP, torch.optim.Optimizer]:
    """The reward MLP with LoRA; per-user A and shared B when `users` is given, else LoRA-global."""
    torch.manual_seed(0)
    m = RewardMLP()
    inject_lora(m, ["net.0", "net.2"], RANK)
    for layer in lora_layers(m).values():
        nn.init.normal_(layer.B, std=0.01)
        if users is not None:
            configure(layer, "user", "shared", users)
    return m, torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=1e-3)


def epoch_mixed(m: nn.Module, opt: torch.optim.Optimizer, data: Prefs, order: list[torch.Tensor]) -> None:
    """Every batch in one routed forward (LoRA-global ignores the routing: its factors are shared)."""
    for idx in order:
        loss = pair_loss(m, data[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def epoch_loop(m: nn.Module, opt: torch.optim.Optimizer, data: Prefs, order: list[torch.Tensor]) -> None:
    """The same batches and loss, but one forward per user present in the batch (the reference we avoid)."""
    for idx in order:
        batch = data[idx]
        loss = 0.0
        for user in batch.users.unique().tolist():
            rows = batch.users == user
            with routed(m, user):
                r = m(torch.cat([batch.chosen[rows], batch.rejected[rows]]))
            n = int(rows.sum())
            loss = loss + bt_loss(r[:n], r[n:]) * n / len(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def time_users(users: int, tokens: int, g: torch.Generator) -> dict[str, float]:
    """Median seconds per epoch of the three candidates on the same pairs and batch order."""
    data = Prefs(torch.randint(0, users, (PAIRS,), generator=g), torch.randn(PAIRS, tokens, DIM, generator=g),
                 torch.randn(PAIRS, tokens, DIM, generator=g))
    order = list(torch.randperm(PAIRS, generator=g).split(BATCH))
    runs = {"global": model(None), "mixed": model(users), "loop": model(users)}
    return compare({"global": lambda: epoch_mixed(*runs["global"], data, order),
                    "mixed": lambda: epoch_mixed(*runs["mixed"], data, order),
                    "loop": lambda: epoch_loop(*runs["loop"], data, order)}, rounds=5, warmup=1)


def time_full_batch(method: str, n_train: int) -> dict[str, float]:
    """Median seconds per full-batch Adam step on the §8.1 problem, routed row by row vs in party blocks."""
    problem = ProblemConfig(n_train=n_train)
    truth, data, _ = generate(problem, 0)
    runs = {}
    for routing in ("rows", "blocks"):
        net = model_for(truth, problem.k)
        prepare(net, method, problem.users, torch.Generator().manual_seed(0))
        for layer in lora_layers(net).values():
            configure(layer, *(("frozen", "user") if method == "full" else ("user", "shared")), problem.users)
        opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=0.02)
        runs[routing] = (net, opt, data.blocks(problem.users) if routing == "blocks" else None)

    def step(net: nn.Module, opt: torch.optim.Optimizer, layout) -> None:
        loss = pair_loss(net, data, layout)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return compare({k: (lambda r=r: [step(*r) for _ in range(5)]) for k, r in runs.items()}, rounds=5, warmup=1)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    print(f"per-token MLP {DIM}->{HIDDEN}->{HIDDEN}, LoRA rank {RANK} on 2 maps, {PAIRS} pairs, batch {BATCH}, "
          "one epoch with Adam (median of 5, interleaved)")
    print(f"{'tokens':>6} {'users':>6} {'global ms':>10} {'mixed ms':>10} {'loop ms':>10} {'mixed/global':>13} "
          f"{'loop/global':>12}")
    for tokens in (16, 1):
        for users in (5, 20, 100):
            t = time_users(users, tokens, g)
            print(f"{tokens:>6} {users:>6} {t['global'] * 1e3:>10.1f} {t['mixed'] * 1e3:>10.1f} "
                  f"{t['loop'] * 1e3:>10.1f} {t['mixed'] / t['global']:>13.2f} {t['loop'] / t['global']:>12.2f}")
    print("\n§8.1 problem (10 users, d1 32, d2 8), 5 full-batch Adam steps (median of 5, interleaved)")
    print(f"{'method':>10} {'N_p':>6} {'rows ms':>10} {'blocks ms':>10} {'rows/blocks':>12}")
    for method in ("pshare_si", "full"):
        for n_train in (100, 800):
            t = time_full_batch(method, n_train)
            print(f"{method:>10} {n_train:>6} {t['rows'] * 1e3:>10.1f} {t['blocks'] * 1e3:>10.1f} "
                  f"{t['rows'] / t['blocks']:>12.2f}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
