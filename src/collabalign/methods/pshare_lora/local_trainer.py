"""Local training of a LoRA reward model routed per user, from a parameter dict: `RoutedLoRA` is FedAvg-LoRA's
`LocalTrainer` and the local step of the personal federated algorithms (`federated.py`). A client trains one copy of
the model in which every factor is a plain matrix, so the user index of its rows plays no part; many clients can
train in one computation with their factors stacked over a leading client dimension."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from collabalign.comm import Params
from collabalign.lora import lora_layers, routed
from collabalign.methods.pshare_lora.sharing import project_
from collabalign.methods.pshare_lora.train import Prefs, batches, pair_loss
from collabalign.models.reward import pair_correct
from collabalign.seeding import Seeds

Kind = Literal["A", "B", "head"]
INIT_STREAM = "federated-lora/init"  # the Seeds stream of the run's initial draw


@dataclass(frozen=True)
class LocalSteps:
    """A client's work per round: `steps` steps of a fresh optimiser on its own pairs (batch_size 0: all of them)."""

    steps: int = 10
    lr: float = 0.02
    optimizer: Literal["adam", "sgd"] = "adam"
    batch_size: int = 0


def kinds(model: nn.Module) -> dict[str, Kind]:
    """Trainable parameter name -> 'A' / 'B' for LoRA factors, 'head' for any other trainable parameter."""
    lora = {f"{name}.{f}": f for name in lora_layers(model) for f in ("A", "B")}
    return {n: lora.get(n, "head") for n, p in model.named_parameters() if p.requires_grad}


class RoutedLoRA:
    """Local training of one LoRA reward model from a parameter dict: FedAvg-LoRA's `LocalTrainer` and the local
    step of the personal algorithms. It keeps one scratch copy of the model, into which every call first loads all
    trainable parameters, so nothing carries over between calls. `tests`: the users' held-out pairs `evaluate`
    scores (FedAvg's evaluation has the global parameters only)."""

    def __init__(self, model_fn: Callable[[], nn.Module], local: LocalSteps, max_norm: float | None = None,
                 tests: Sequence[Prefs] = ()):
        self.model = model_fn()
        self.kinds = kinds(self.model)
        if not any(k == "A" for k in self.kinds.values()):
            raise ValueError("the model has no LoRA layer")
        self.initial = self.params()
        self.local, self.max_norm, self.tests = local, max_norm, tuple(tests)

    def params(self) -> Params:
        """Every trainable parameter of the scratch model as a float32 array."""
        return {n: p.detach().numpy().copy() for n, p in self.model.named_parameters() if n in self.kinds}

    def load(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets every trainable parameter of the scratch model (all must be given)."""
        missing = set(self.kinds) - set(params)
        if missing:
            raise KeyError(f"parameters not given: {sorted(missing)}")
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in self.kinds:
                    p.copy_(torch.from_numpy(np.asarray(params[n])))

    def start(self, generator: torch.Generator) -> Params:
        """Initial parameters: one kaiming draw of every A from `generator` (layers in order, as `prepare`), B = 0,
        the model's head."""
        self.load(self.initial)
        for layer in lora_layers(self.model).values():
            layer.reset_parameters(generator)
        return self.params()

    # ---- the LocalTrainer protocol (FedAvg-LoRA) ----
    def initial_params(self, seeds: Seeds) -> Params:
        return self.start(torch.Generator().manual_seed(seeds.entropy(INIT_STREAM)))

    def train(self, params: Params, data: dict[str, Any], rng: torch.Generator | None) -> tuple[Params, int]:
        return self.fit(params, data["train"], rng, self.local.lr), len(data["train"])

    def train_many(self, starts: list[Params], data: list[dict[str, Any]],
                   rngs: list[torch.Generator | None]) -> list[tuple[Params, int]]:
        """`train` for many clients in one computation (see `fit_many`)."""
        trained = self.fit_many(starts, [d["train"] for d in data], rngs, self.local.lr)
        return [(p, len(d["train"])) for p, d in zip(trained, data, strict=True)]

    def evaluate(self, params: Params) -> dict[str, float]:
        """Mean and lowest held-out accuracy over the users' test sets of one model for all."""
        return summary([self.accuracy(params, test) for test in self.tests])

    # ---- training and scoring ----
    def fit(self, params: Params, data: Prefs, rng: torch.Generator | None, lr: float) -> Params:
        """`local.steps` steps of a fresh Adam / SGD from `params`, projecting after each step if asked."""
        self.load(params)
        opt = self.optimiser([p for n, p in self.model.named_parameters() if n in self.kinds], lr)
        stream = batches(len(data), self.local.batch_size, rng)
        for _ in range(self.local.steps):
            self.step(opt, pair_loss(self.model, data[next(stream)]))
        return self.params()

    def fit_many(self, starts: list[Params], data: list[Prefs], rngs: list[torch.Generator | None],
                 lr: float) -> list[Params]:
        """`fit` for many clients in one computation: each LoRA factor stacked over clients (a leading client
        dimension) and the sum of the clients' mean losses minimised, which gives each client exactly its own
        gradients (and, Adam being elementwise, its own optimiser). A trainable head is not stacked: such a model
        trains its clients one after the other."""
        if any(k == "head" for k in self.kinds.values()):
            return [self.fit(s, d, g, lr) for s, d, g in zip(starts, data, rngs, strict=True)]
        originals = {n: p for n, p in self.model.named_parameters() if n in self.kinds}
        try:
            for n in self.kinds:
                _set_factor(self.model, n, nn.Parameter(torch.from_numpy(np.stack([s[n] for s in starts]))))
            self.fit_stacked(data, rngs, lr)
            trained = {n: p.detach().numpy() for n, p in self.model.named_parameters() if n in self.kinds}
        finally:
            for n, p in originals.items():
                _set_factor(self.model, n, p)
        return [{n: trained[n][i].copy() for n in self.kinds} for i in range(len(starts))]

    def fit_stacked(self, data: list[Prefs], rngs: list[torch.Generator | None], lr: float) -> None:
        """Local steps for clients whose factors are stacked: rows routed to their client, each client's batch from
        its own stream, loss = sum over clients of their mean Bradley–Terry loss."""
        sizes = torch.tensor([len(d) for d in data])
        offsets = torch.cumsum(sizes, 0) - sizes
        party = torch.repeat_interleave(torch.arange(len(data)), sizes)
        chosen = torch.cat([d.chosen for d in data])
        rejected = torch.cat([d.rejected for d in data])
        streams = [batches(len(d), self.local.batch_size, g) for d, g in zip(data, rngs, strict=True)]
        opt = self.optimiser([p for p in self.model.parameters() if p.requires_grad], lr)
        for _ in range(self.local.steps):
            idx = torch.arange(len(party)) if self.local.batch_size <= 0 else \
                torch.cat([off + next(s) for off, s in zip(offsets, streams, strict=True)])
            p = party[idx]
            with routed(self.model, torch.cat([p, p])):
                r = self.model(torch.cat([chosen[idx], rejected[idx]]))
            nll = -torch.nn.functional.logsigmoid(r[:len(idx)] - r[len(idx):])
            self.step(opt, (nll / torch.bincount(p, minlength=len(data))[p]).sum())

    def optimiser(self, params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr) if self.local.optimizer == "adam" else torch.optim.SGD(params, lr=lr)

    def step(self, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        """One optimiser step, then the per-user norm projection of every LoRA layer if asked."""
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if self.max_norm is not None:
            for layer in lora_layers(self.model).values():
                project_(layer, self.max_norm)

    def accuracy(self, params: Params, test: Prefs) -> float:
        """Held-out preference accuracy of the model with `params` on `test` (ties count half)."""
        return float(self.hits(params, test).mean())

    def hits(self, params: Params, test: Prefs) -> Tensor:
        """Per pair of `test`: 1 when the model with `params` ranks the chosen text higher, 0.5 for a tie, else 0."""
        self.load(params)
        with torch.no_grad(), routed(self.model, torch.cat([test.users, test.users])):
            r = self.model(torch.cat([test.chosen, test.rejected]))
        return pair_correct(r[:len(test)], r[len(test):])

    def assemble(self, shared: Params, personal: Sequence[Params] = ()) -> nn.Module:
        """A centralised-shaped model: the `shared` parameters, and for each name in the users' `personal`
        parameters (in user order) that factor stacked by user (a leading user dimension), so centralised metrics
        (`synthetic.evaluate`) apply unchanged."""
        net = copy.deepcopy(self.model)
        with torch.no_grad():
            for n, p in net.named_parameters():
                if n in self.kinds:
                    p.copy_(torch.from_numpy(shared[n]))
        for n in personal[0] if personal else ():
            if self.kinds[n] == "head":
                raise ValueError("a personal head has no centralised-shaped model with a shared head")
            _set_factor(net, n, nn.Parameter(torch.from_numpy(np.stack([params[n] for params in personal])), False))
        return net


def summary(accuracies: list[float]) -> dict[str, float]:
    """The evaluation record: mean and lowest accuracy over users."""
    return {"accuracy": float(np.mean(accuracies)), "accuracy_min": float(np.min(accuracies))}


def _set_factor(model: nn.Module, name: str, value: nn.Parameter) -> None:
    """Replaces the LoRA factor '<layer>.A' / '<layer>.B' of `model` (its shape may change: stacked per user)."""
    layer, factor = name.rsplit(".", 1)
    setattr(model.get_submodule(layer), factor, value)
