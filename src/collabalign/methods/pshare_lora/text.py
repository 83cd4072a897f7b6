"""The P-ShareLoRA text reward model (spec §8.4): a MiniLM-style encoder with LoRA on `query` and `key` of its top
blocks, the frozen blocks below run once per text and cached, mean pooling and a scalar score head that is shared
(global, P-ShareLoRA, share-A, Share Rep's same-head variant, the frozen backbone) or one per user (LoRA-local, Share
Rep and its phased ablation; spec §9.5: the paper's "personalized heads"), routed per sample like the LoRA factors.
The model's input is a tensor of row indices into the cached texts (`prefs_from_pairs` lays preference pairs out
as rows), so `Prefs(users, chosen_rows, rejected_rows)` trains with the method-agnostic `prepare / schedule / train`
unchanged."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from collabalign.data.preferences import PreferencePair
from collabalign.lora.inject import lora_layers, routed
from collabalign.lora.layer import Blocks, Party
from collabalign.methods.pshare_lora.train import Prefs, per_user_mean, prepare, schedule, train
from collabalign.models.backbones import Backbone
from collabalign.models.cached import CachedModel, TextCache, cache_texts, lora_top_blocks
from collabalign.models.pooled import PooledModel, layer_stack
from collabalign.models.reward import pair_correct, pair_texts
from collabalign.seeding import Seeds

TARGETS = ("query", "key")
PER_USER_HEAD = ("local", "share_rep", "share_rep_phased", "frozen_per_user")


def encode(backbone: Backbone, texts: Sequence[str], max_length: int, lora_blocks: int,
           second: Sequence[str] | None = None, truncation_side: str = "left") -> TextCache:
    """Tokenises the texts (or text pairs) and runs the frozen blocks below the top `lora_blocks` once."""
    pooled = PooledModel(backbone.model, backbone.causal, 1)  # only its frozen lower blocks run, without grad
    split = max(0, len(layer_stack(pooled.backbone)[1]) - lora_blocks)
    return cache_texts(pooled, backbone.tokenizer, texts, max_length, split, second, truncation_side)


def prefs_from_pairs(pairs: Sequence[PreferencePair], users: Sequence[int]) -> tuple[list[str], Prefs]:
    """The texts to `encode` and the `Prefs` that index them: pair k's chosen text (prompt + chosen) is cache row 2k,
    its rejected text (prompt + rejected) row 2k + 1, and its user `users[k]` (an index 0..n_users - 1)."""
    if len(users) != len(pairs):
        raise ValueError(f"{len(pairs)} pairs but {len(users)} users")
    chosen, rejected = pair_texts(pairs)
    rows = torch.arange(len(pairs))
    texts = [t for pair in zip(chosen, rejected, strict=True) for t in pair]
    return texts, Prefs(torch.as_tensor(list(users), dtype=torch.long), 2 * rows, 2 * rows + 1)


class RoutedHead(nn.Module):
    """Score head w . h + b: one (w, b) for everyone, or one per user picked by the per-sample user index that
    `routed` gave the model's LoRA layers (the model passes it on), so a mixed-user batch is one forward."""

    def __init__(self, hidden: int, n_users: int | None, generator: torch.Generator):
        super().__init__()
        rows = 1 if n_users is None else n_users
        self.per_user = n_users is not None
        self.weight = nn.Parameter(torch.randn(rows, hidden, generator=generator) / hidden ** 0.5)
        self.bias = nn.Parameter(torch.zeros(rows))
        self.party: Party = None

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.weight.dtype)  # a bfloat16 backbone feeds a float32 head
        if not self.per_user:
            return x @ self.weight.T + self.bias
        if self.party is None:
            raise ValueError("per-user score head but no user was routed (use routed(model, users))")
        party = self.party
        if isinstance(party, Blocks):  # rows in equal per-party blocks (full-batch training): expand to rows
            party = torch.arange(party.parties).repeat_interleave(len(x) // (party.parties * party.repeats))
            party = party.repeat(self.party.repeats)
        return ((x * self.weight[party]).sum(-1) + self.bias[party]).unsqueeze(-1)  # int or (N,) party


class TextRewardModel(CachedModel):
    """r_i(text row) with LoRA (rank, alpha, dropout) on `query`/`key` of the top blocks above `cache.split`."""

    def __init__(self, backbone: Backbone, cache: TextCache, rank: int, alpha: float, dropout: float,
                 n_users: int, per_user_head: bool, generator: torch.Generator, targets: Sequence[str] = TARGETS,
                 checkpointing: bool = False):
        pooled = PooledModel(copy.deepcopy(backbone.model), backbone.causal, 1, generator)  # the caller's stays bare
        n_blocks = len(layer_stack(pooled.backbone)[1])
        lora_top_blocks(pooled, n_blocks - cache.split, targets, rank, alpha, dropout)
        pooled.head = RoutedHead(pooled.head.in_features, n_users if per_user_head else None, generator)
        super().__init__(pooled, cache)  # the cache is a plain attribute: shared, not in state_dict
        self.lora = tuple(lora_layers(pooled).values())  # a tuple, so not registered twice as submodules
        for layer in self.lora:  # trainable factors in float32 whatever the backbone's dtype
            layer.A, layer.B = nn.Parameter(layer.A.detach().float()), nn.Parameter(layer.B.detach().float())
        self.checkpointing = checkpointing
        if checkpointing:  # recompute each block's activations in the backward: memory for time
            pooled.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def forward(self, rows: Tensor) -> Tensor:
        self.pooled.head.party = self.lora[0].party
        return super().forward(rows).squeeze(-1)

    def lora_dropout(self, on: bool) -> None:
        """The backbone's own dropout off (as in the paper's models), LoRA dropout `on`. With gradient checkpointing
        the backbone stays in training mode while training (Hugging Face only checkpoints then), dropout modules off."""
        self.eval()
        if on and self.checkpointing:
            self.pooled.backbone.train()
            for module in self.pooled.backbone.modules():
                if isinstance(module, nn.Dropout):
                    module.eval()
        for layer in self.lora:
            layer.dropout.train(on)


def share_rep_frozen(n_blocks: int, lora_blocks: int, per_block: int, frozen_fraction: float = 0.7) -> int:
    """How many LoRA layers (bottom to top, as `schedule` counts them) lie in the bottom floor(frozen_fraction *
    n_blocks) transformer blocks: Share Rep's frozen shared representation measured in blocks, not LoRA layers
    (blocks without LoRA are frozen anyway)."""
    return max(0, math.floor(frozen_fraction * n_blocks) - (n_blocks - lora_blocks)) * per_block


@dataclass(frozen=True)
class TextTraining:
    """What one text run trains with (spec §8.4)."""

    rank: int = 8
    alpha: float = 4.0
    dropout: float = 0.05
    batch_size: int = 32
    epochs: float = 3.0
    lr: float = 3e-3
    linear: bool = True
    global_fraction: float = 2 / 3
    warmup_fraction: float = 0.1
    frozen_fraction: float = 0.7
    device: str = "cpu"
    targets: tuple[str, ...] = TARGETS
    micro_batch: int = 0  # pairs per forward / backward within a batch (0: the whole batch)
    checkpointing: bool = False


def fit_model(backbone: Backbone, cache: TextCache, data: Prefs, method: str, n_users: int, tc: TextTraining,
              seed: int) -> tuple[TextRewardModel, list[float], int]:
    """Trains `method` for `epochs` passes' worth of steps; returns the model (LoRA dropout off), the losses and the
    step count."""
    g = Seeds(seed).torch(f"text-{method}")
    model = TextRewardModel(backbone, cache, tc.rank, tc.alpha, tc.dropout, n_users, method in PER_USER_HEAD, g,
                            tc.targets, tc.checkpointing)
    model.to(tc.device)
    prepare(model, method, n_users, g)
    steps = max(1, round(tc.epochs * math.ceil(len(data) / tc.batch_size)))
    n_blocks = len(layer_stack(model.pooled.backbone)[1])
    frozen = share_rep_frozen(n_blocks, n_blocks - cache.split, len(tc.targets), tc.frozen_fraction)
    phases = schedule(method, len(model.lora), steps, tc.lr, tc.linear, tc.global_fraction, tc.warmup_fraction,
                      frozen_layers=frozen)
    Seeds(seed).init_torch(f"dropout-{method}")  # LoRA dropout draws from torch's global generator
    model.lora_dropout(True)
    losses = train(model, data, phases, n_users, tc.batch_size, g, micro_batch=tc.micro_batch)
    model.lora_dropout(False)
    return model, losses, steps


def fit(backbone: Backbone, cache: TextCache, data: Prefs, test: Prefs, method: str, n_users: int,
        tc: TextTraining, seed: int) -> dict:
    """Trains `method` (`fit_model`) and returns held-out accuracy (overall, per user)."""
    model, losses, steps = fit_model(backbone, cache, data, method, n_users, tc, seed)
    return {**evaluate(model, test, n_users), "train_loss": round(losses[-1], 6), "steps": steps}


@torch.no_grad()
def evaluate(model: nn.Module, test: Prefs, n_users: int, batch_size: int = 128) -> dict:
    """Held-out accuracy per user (each user's own model; ties 0.5) and its mean over users."""
    return accuracy_by_user(pair_hits(model, test, batch_size), test.users, n_users)


def pair_hits(model: nn.Module, test: Prefs, batch_size: int = 128) -> Tensor:
    """Per held-out pair: 1 when its user's model ranks the chosen text higher, 0.5 for a tie, else 0."""
    right = []
    for start in range(0, len(test), batch_size):
        batch = test[torch.arange(start, min(start + batch_size, len(test)))]
        with routed(model, torch.cat([batch.users, batch.users])):
            r = model(torch.cat([batch.chosen, batch.rejected]))
        right.append(pair_correct(r[: len(batch)], r[len(batch):]).cpu())
    return torch.cat(right)


def accuracy_by_user(hits: Tensor, users: Tensor, n_users: int) -> dict:
    """Accuracy per user from per-pair hits, and its mean over users."""
    per_user = per_user_mean(users, hits, n_users)
    return {"accuracy": round(float(per_user.mean()), 6), "accuracy_per_user": [round(float(a), 4) for a in per_user]}

