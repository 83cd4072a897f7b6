"""Bradley–Terry reward-model training of LoRA + head on cached lower-layer features: the `LocalTrainer` behind
FedAvg-LoRA, local-only and centralised reward modelling."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from collabalign.comm import Params
from collabalign.data.preferences import PreferencePair
from collabalign.lora.inject import lora_layers
from collabalign.lora.stacked import route, routing, stacked
from collabalign.methods.drift import Correction
from collabalign.models.cached import TextCache, cache_texts
from collabalign.models.pooled import Tokens
from collabalign.models.reward import RewardModel, bt_loss, pair_texts, preference_accuracy
from collabalign.seeding import Seeds


@dataclass
class EncodedPairs:
    """n pairs as 2n cached texts: rows :n the chosen, rows n: the rejected replies."""

    texts: TextCache

    def __len__(self) -> int:
        return len(self.texts) // 2

    def __getitem__(self, pairs: Tensor | np.ndarray) -> EncodedPairs:
        """The subset of pairs `pairs` (indices), keeping the chosen-then-rejected layout."""
        return EncodedPairs(self.texts[self.rows(pairs)])

    def rows(self, pairs: Tensor | np.ndarray) -> Tensor:
        """The texts of `pairs`: their chosen replies, then their rejected ones."""
        return torch.cat([torch.as_tensor(pairs), torch.as_tensor(pairs) + len(self)])

    def batch(self, pairs: Tensor, device: torch.device | str = "cpu") -> tuple[Tokens, Tensor | None]:
        """Tokens and features of `pairs` (chosen then rejected), trimmed to the longest real text among them, on
        `device`."""
        return self.texts.batch(self.rows(pairs), device)


def encode_pairs(model: RewardModel, tokenizer, pairs: Sequence[PreferencePair], max_length: int,
                 split: int) -> EncodedPairs:
    """Tokenises prompt+reply texts and runs the frozen blocks below `split` once."""
    chosen, rejected = pair_texts(pairs)
    return EncodedPairs(cache_texts(model, tokenizer, chosen + rejected, max_length, split))


class RewardTrainer:
    """Trains the LoRA factors and the head of `model` (everything else frozen) with AdamW, fresh each call."""

    def __init__(self, model: RewardModel, test: EncodedPairs, lr: float, epochs: int, batch_size: int,
                 eval_batch_size: int = 128, max_rows: int = 128):
        self.model, self.test = model, test
        self.split = test.texts.split  # every EncodedPairs it sees caches the same blocks
        self.lr, self.epochs, self.batch_size, self.eval_batch_size = lr, epochs, batch_size, eval_batch_size
        self.max_rows = max_rows  # pairs per batched step of `train_many` (whole clients)

    @property
    def device(self) -> torch.device:
        """Where the model trains (its head's device); the cached texts stay on the CPU and travel per batch."""
        return self.model.head.weight.device

    def trainable(self) -> dict[str, Tensor]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def initial_params(self, seeds: Seeds) -> Params:
        """LoRA A ~ Kaiming-uniform, B = 0 (so the start is the frozen backbone) and a random head, from `seeds`."""
        generator = seeds.torch("reward-init")
        for layer in lora_layers(self.model).values():
            layer.reset_parameters(generator)
        with torch.no_grad():
            hidden = self.model.head.weight.shape[1]
            self.model.head.weight.copy_(torch.randn(1, hidden, generator=generator) / hidden**0.5)
            self.model.head.bias.zero_()
        return self.params()

    def params(self) -> Params:
        return {n: p.detach().cpu().numpy().copy() for n, p in self.trainable().items()}

    def load(self, params: Params) -> None:
        with torch.no_grad():
            for name, p in self.trainable().items():
                p.copy_(torch.from_numpy(params[name]))

    def rewards(self, tokens: Tokens, features: Tensor | None) -> tuple[Tensor, Tensor]:
        r = self.model(tokens, features, self.split)
        return r[: len(r) // 2], r[len(r) // 2:]

    def train(self, params: Params, data: EncodedPairs, rng: torch.Generator,
              correction: Correction | None = None) -> tuple[Params, int]:
        """AdamW from `params` on `data`; `correction` (FedProx, SCAFFOLD) amends each step's gradients."""
        self.load(params)
        optimizer = torch.optim.AdamW(self.trainable().values(), lr=self.lr, weight_decay=0.0)
        for _ in range(self.epochs):
            order = torch.randperm(len(data), generator=rng)
            for start in range(0, len(data), self.batch_size):
                loss = bt_loss(*self.rewards(*data.batch(order[start:start + self.batch_size], self.device)))
                optimizer.zero_grad()
                loss.backward()
                if correction is not None:
                    correction.apply(self.trainable())
                optimizer.step()
        return self.params(), len(data)

    def train_many(self, params: Sequence[Params], data: Sequence[EncodedPairs],
                   rngs: Sequence[torch.Generator]) -> list[tuple[Params, int]]:
        """`train` for many clients in one batched computation (`lora.stacked`): the same batches and results as one
        client after another, up to rounding. Clients with the same number of steps per epoch train together (their
        AdamW states share a step count); each draws its epochs' orders from its own generator first."""
        orders = [[torch.randperm(len(d), generator=g) for _ in range(self.epochs)]
                  for d, g in zip(data, rngs, strict=True)]
        groups: dict[int, list[int]] = defaultdict(list)
        for i, d in enumerate(data):
            groups[math.ceil(len(d) / self.batch_size)].append(i)
        chunk = max(1, self.max_rows // self.batch_size)  # clients per computation: a working set that fits caches
        out: list[tuple[Params, int]] = [({}, 0)] * len(data)
        for members in (g[s:s + chunk] for g in groups.values() for s in range(0, len(g), chunk)):
            trained = self._train_group([params[i] for i in members], [data[i] for i in members],
                                        [orders[i] for i in members])
            for i, p in zip(members, trained, strict=True):
                out[i] = (p, len(data[i]))
        return out

    def _train_group(self, params: list[Params], data: list[EncodedPairs], orders: list[list[Tensor]]) -> list[Params]:
        layers = lora_layers(self.model)
        factors = [{n: (torch.from_numpy(p[f"{n}.B"]), torch.from_numpy(p[f"{n}.A"])) for n in layers} for p in params]
        heads = [{"head": (torch.from_numpy(p["head.weight"]), torch.from_numpy(p["head.bias"]))} for p in params]
        scales = [{n: layer.scale for n, layer in layers.items()}] * len(params)
        texts = TextCache.cat([d.texts for d in data])  # every client's texts once; each step gathers its rows
        starts = np.cumsum([0] + [len(d.texts) for d in data[:-1]]).tolist()
        with stacked(self.model, factors, scales, heads) as stack:
            optimizer = torch.optim.AdamW(stack.params, lr=self.lr, weight_decay=0.0)
            for epoch in range(self.epochs):
                for step in range(math.ceil(len(data[0]) / self.batch_size)):
                    picks = [order[epoch][step * self.batch_size:(step + 1) * self.batch_size] for order in orders]
                    rows = torch.cat([start + d.rows(p) for d, p, start in zip(data, picks, starts, strict=True)])
                    route(self.model, routing([2 * len(p) for p in picks], self.device))
                    rewards = self.model(*texts.batch(rows, self.device), self.split)
                    ends = np.cumsum([2 * len(p) for p in picks]).tolist()
                    loss = sum(bt_loss(rewards[end - 2 * len(p): end - len(p)], rewards[end - len(p): end])
                               for p, end in zip(picks, ends, strict=True))
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
        keys = list(self.trainable())
        return [{key: out[key] for key in keys} for out in map(stack.client, range(len(params)))]

    @torch.no_grad()
    def test_rewards(self, params: Params, data: EncodedPairs | None = None) -> tuple[Tensor, Tensor]:
        """(r_chosen, r_rejected) for every pair of `data` (default: the held-out set) under `params`."""
        self.load(params)
        data = self.test if data is None else data
        out = [self.rewards(*data.batch(torch.arange(s, min(s + self.eval_batch_size, len(data))), self.device))
               for s in range(0, len(data), self.eval_batch_size)]
        return torch.cat([c for c, _ in out]), torch.cat([r for _, r in out])

    def evaluate(self, params: Params) -> dict[str, float]:
        chosen, rejected = self.test_rewards(params)
        return {"accuracy": preference_accuracy(chosen, rejected), "loss": float(bt_loss(chosen, rejected))}
