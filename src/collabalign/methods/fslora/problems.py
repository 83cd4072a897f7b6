"""What a device trains in the heterogeneous-rank LoRA family: a torch model whose adapted layers are
`LoRALinear`s, plus a densely trained head. The algorithms only exchange numpy factors with it:

- `local_train(factors, head, scale, base, data, rng)`: the `LocalSGD` steps (plain SGD, with momentum, or AdamW,
  the optimiser's state fresh every round as in the authors' GLUE code) on rank-k blocks
  {layer: (B (m, k), A (k, n))} with y = (W0 + base) x + scale * B A x; returns the trained blocks and head.
  LoRA dropout (if the layers have it) is the only dropout on, with masks drawn from `rng`.
- `evaluate(delta, head)`: metrics of W0 + delta (dense, per layer) and the head on the held-out set.

Classification (integer labels) trains with cross-entropy; regression (float labels, one output: STS-B) with MSE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from collabalign.comm import Params
from collabalign.data.glue import pearson_corr
from collabalign.lora.inject import lora_layers
from collabalign.lora.stacked import route, routing, stacked
from collabalign.seeding import Seeds

Factors = dict[str, tuple[np.ndarray, np.ndarray]]  # layer -> (B (m, k), A (k, n))
PRECISIONS = ("float32", "bfloat16")  # of the matrix products; weights, optimiser state and losses stay float32


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {list(PRECISIONS)}")
    return precision


def eager_attention(model: nn.Module) -> None:
    """The Hugging Face modules in `model` switched to their eager attention (matrix products and a softmax)."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if hasattr(config, "_attn_implementation"):
            config._attn_implementation = "eager"


@dataclass(frozen=True)
class LocalSGD:
    """A device's training in one round: `steps` minibatch steps of SGD (with `momentum`) or AdamW (with
    `weight_decay`), the optimiser's state fresh every round; with `lora` False only the head trains (LoRA off, the
    factors come back unchanged: the frozen-backbone baseline)."""

    steps: int
    lr: float
    batch_size: int = 16
    momentum: float = 0.0
    lora: bool = True
    optimizer: str = "sgd"  # sgd | adamw
    weight_decay: float = 0.0  # adamw only

    def __post_init__(self) -> None:
        if self.optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be sgd or adamw, got {self.optimizer!r}")

    def make(self, params: list[Tensor]) -> torch.optim.Optimizer:
        """A fresh optimiser over `params` (elementwise, so devices stacked in one tensor train as one by one)."""
        if self.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)


class LocalJob(NamedTuple):
    """One device's `local_train` arguments: its blocks, head, LoRA scale (one, or per layer), dense base (None:
    W0), data, generator, and whether A trains (False: A stays at what was sent, FFA-LoRA)."""

    factors: Factors
    head: Params
    scale: float | dict[str, float]
    base: dict[str, np.ndarray] | None
    data: ClassificationData
    rng: torch.Generator
    train_a: bool = True


@dataclass
class ClassificationData:
    """Inputs (any tensor the model takes, first dim = samples) and labels: integer classes, or float targets."""

    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, rows) -> ClassificationData:
        return ClassificationData(self.x[rows], self.y[rows])


class TorchLoRAProblem:
    """A classifier `model` (LoRA layers + head parameters named `head_names`) trained with cross-entropy, or a
    regressor (float `test.y`) whose first output is trained with MSE. The model stays in eval mode: only the LoRA
    layers' dropout is switched on, during `local_train`."""

    batched = True  # `local_train_many` stacks devices: the loss is a mean over rows of `model(x)` and labels

    def __init__(self, model: nn.Module, head_names: list[str], test: ClassificationData, sgd: LocalSGD,
                 metric: tuple[str, Callable[[np.ndarray, np.ndarray], float]] | None = None,
                 eval_batch_size: int = 512, device: str = "cpu", precision: str = "float32"):
        self.device = torch.device(device)
        self.precision = check_precision(precision)
        if precision == "bfloat16":  # PyTorch's CPU flash-attention backward in bfloat16 is ~8x slower than float32's
            eager_attention(model)
        self.model = model.to(self.device).eval()
        self.regression = test.y.is_floating_point()
        self.test, self.sgd = test, sgd
        self.layers = lora_layers(model)
        self.w0 = {name: layer.base.weight.detach().clone() for name, layer in self.layers.items()}
        params = dict(model.named_parameters())
        self.head = {name: params[name].requires_grad_(True) for name in head_names}
        self.head_modules = sorted({name.rpartition(".")[0] for name in head_names})  # linear layers: weight, bias
        if metric is None and self.regression:
            metric = ("pearson", pearson_corr)
        self.metric = metric  # (name, fn(preds, labels)) reported beside accuracy/loss, e.g. Matthews corr. for CoLA
        self.eval_batch_size = eval_batch_size
        self._at_w0 = False  # the loaded model is W0 with LoRA off: the frozen backbone (set by `load`)
        self._frozen: Tensor | None = None  # the head's inputs at W0 for every cached row, computed once

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        """(m, n) = (out, in) of each adapted layer."""
        return {name: tuple(w.shape) for name, w in self.w0.items()}

    def init_head(self, seeds: Seeds) -> Params:
        """A fresh head: PyTorch's default uniform init, drawn from `seeds`."""
        gen = seeds.torch("head-init")
        out = {}
        for name, p in self.head.items():
            fan_in = p.shape[1] if p.dim() == 2 else p.shape[0]
            bound = 1 / math.sqrt(fan_in)
            out[name] = (torch.rand(p.shape, generator=gen) * 2 * bound - bound).numpy()
        return out

    def init_a(self, generator: torch.Generator, k: int, n: int) -> np.ndarray:
        """PEFT's default for A: uniform(-1/sqrt(n), 1/sqrt(n))."""
        bound = 1 / math.sqrt(n)
        return (torch.rand(k, n, generator=generator) * 2 * bound - bound).numpy()

    def load(self, factors: Factors | None, head: Params, scale: float | dict[str, float],
              base: dict[str, np.ndarray] | None) -> None:
        self._at_w0 = factors is None and (base is None or not any(np.any(b) for b in base.values()))
        with torch.no_grad():
            for name, layer in self.layers.items():
                w = self.w0[name] if base is None else self.w0[name] + self._tensor(base[name])
                layer.base.weight.copy_(w)
                layer.enabled = factors is not None
                if factors is not None:
                    B, A = factors[name]
                    s = scale[name] if isinstance(scale, dict) else scale
                    layer.set_factors(self._tensor(A), self._tensor(B), s)
            for name, p in self.head.items():
                p.copy_(self._tensor(head[name]))

    def _tensor(self, array: np.ndarray) -> Tensor:
        return torch.from_numpy(array).to(self.device)

    def _criterion(self, logits: Tensor, y: Tensor) -> Tensor:
        """MSE of the first output for regression, else cross-entropy."""
        return F.mse_loss(logits[:, 0], y) if self.regression else F.cross_entropy(logits, y)

    def forward(self, x: Tensor) -> Tensor:
        """The model's outputs on rows `x`, as float32 (matrix products in `precision` under autocast). At W0 with LoRA
        off (the frozen arm, a head alone) the head runs on its inputs computed once (`frozen_features`)."""
        frozen = self.frozen_features() if self._at_w0 else None
        if frozen is not None:
            return self._head_layer()(frozen[x].to(self.device))
        with self._autocast():
            return self.model(x.to(self.device)).float()

    def _head_layer(self) -> nn.Module:
        return self.model.get_submodule(self.head_modules[0])

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, torch.bfloat16, enabled=self.precision == "bfloat16")

    @torch.no_grad()
    def frozen_features(self) -> Tensor | None:
        """The head's inputs for every row of a cached-text model (`CachedModel`) at W0 with LoRA off, computed once
        on the first call; None for other models (no row cache, or no single head layer)."""
        rows = len(getattr(self.model, "cache", ()))
        if self._frozen is None and rows and len(self.head_modules) == 1:
            saved = {name: (layer.enabled, layer.base.weight.clone()) for name, layer in self.layers.items()}
            captured: list[Tensor] = []
            handle = self._head_layer().register_forward_pre_hook(
                lambda module, args: captured.append(args[0].float().cpu()))
            try:
                for name, layer in self.layers.items():
                    layer.enabled = False
                    layer.base.weight.copy_(self.w0[name])
                with self._autocast():
                    for start in range(0, rows, self.eval_batch_size):
                        self.model(torch.arange(start, min(start + self.eval_batch_size, rows)).to(self.device))
            finally:
                handle.remove()
                for name, (enabled, weight) in saved.items():
                    self.layers[name].enabled = enabled
                    self.layers[name].base.weight.copy_(weight)
            self._frozen = torch.cat(captured)
        return self._frozen

    def loss(self, batch: ClassificationData) -> Tensor:
        return self._criterion(self.forward(batch.x), batch.y.to(self.device))

    def local_train(self, factors: Factors, head: Params, scale: float | dict[str, float],
                    base: dict[str, np.ndarray] | None, data: ClassificationData,
                    rng: torch.Generator, train_a: bool = True) -> tuple[Factors, Params]:
        """`sgd.steps` SGD steps on minibatches drawn with replacement; only the blocks (B alone without `train_a`)
        and the head move (only the head without `sgd.lora`). With LoRA dropout, one seed drawn from `rng` first fixes
        the masks."""
        lora = self.sgd.lora
        self.load(factors if lora else None, head, scale, base)
        params = [p for layer in self.layers.values() for p in ((layer.B, layer.A) if train_a else (layer.B,))
                  ] if lora else []
        optimizer = self.sgd.make(params + list(self.head.values()))
        dropout = lora and any(isinstance(layer.dropout, nn.Dropout) for layer in self.layers.values())
        seed = int(torch.randint(2**62, (1,), generator=rng)) if dropout else None  # no draw: runs without it as before
        with self._training(lora), self._seeded(seed):
            for _ in range(self.sgd.steps):
                rows = torch.randint(len(data), (min(self.sgd.batch_size, len(data)),), generator=rng)
                loss = self.loss(data[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        if lora:
            trained = {n: (_array(lay.B), _array(lay.A)) for n, lay in self.layers.items()}
        else:
            trained = {n: (B.copy(), A.copy()) for n, (B, A) in factors.items()}
        return trained, {n: _array(p) for n, p in self.head.items()}

    def local_train_many(self, jobs: Sequence[LocalJob]) -> list[tuple[Factors, Params]]:
        """`local_train` for many devices as one batched computation (`lora.stacked`): the same steps, batches and
        results as one device after another, up to rounding. Devices with dense bases that differ (FedStackLoRA) or
        LoRA dropout (its masks are drawn per device), and problems with a loss of their own, run one after another;
        one base shared by every device (FedEx-LoRA's) is loaded once; heads alone on frozen features need no
        stacking."""
        dropout = self.sgd.lora and any(isinstance(layer.dropout, nn.Dropout) for layer in self.layers.values())
        head_only = not self.sgd.lora and all(job.base is None for job in jobs) and \
            self.frozen_features() is not None
        if not self.batched or dropout or head_only or len(jobs) < 2 or not _same_base(jobs) or \
                len({job.train_a for job in jobs}) > 1:
            return [self.local_train(*job) for job in jobs]
        sgd, lora = self.sgd, self.sgd.lora
        rows = [[torch.randint(len(job.data), (min(sgd.batch_size, len(job.data)),), generator=job.rng)
                 for _ in range(sgd.steps)] for job in jobs]  # each device's draws, in its own order
        sizes = [len(r[0]) for r in rows]
        ends = np.cumsum(sizes).tolist()
        data = ClassificationData(torch.cat([job.data.x for job in jobs]), torch.cat([job.data.y for job in jobs]))
        offsets = np.cumsum([0] + [len(job.data) for job in jobs[:-1]]).tolist()
        steps = [torch.cat([r[step] + off for r, off in zip(rows, offsets, strict=True)]) for step in range(sgd.steps)]
        factors = [{n: (self._tensor(B), self._tensor(A)) for n, (B, A) in job.factors.items()} for job in jobs]
        heads = [{m: (self._tensor(job.head[f"{m}.weight"]), self._tensor(job.head[f"{m}.bias"]))
                  for m in self.head_modules} for job in jobs]
        self.load(None, jobs[0].head, 1.0, jobs[0].base)  # the base weights: W0, or W0 + the shared base
        self._at_w0 = False  # the stacked LoRA layers run: not the frozen backbone
        with stacked(self.model, factors if lora else None, [job.scale for job in jobs], heads) as stack, \
                self._training(lora):
            route(self.model, routing(sizes, self.device))
            frozen = () if jobs[0].train_a else tuple(n for n in stack.names if n.endswith(".A"))
            optimizer = sgd.make([p for n, p in zip(stack.names, stack.params, strict=True) if n not in frozen])
            for step in steps:
                batch = data[step]
                logits, y = self.forward(batch.x), batch.y.to(self.device)
                loss = sum(self._criterion(logits[a:b], y[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        results = []
        for i, job in enumerate(jobs):
            out = stack.client(i)
            trained = {n: (out[f"{n}.B"], out[f"{n}.A"]) if lora else (B.copy(), A.copy())
                       for n, (B, A) in job.factors.items()}
            results.append((trained, {name: out[name] for name in self.head}))
        return results

    @contextmanager
    def _training(self, lora: bool) -> Iterator[None]:
        """LoRA dropout in train mode and, without `lora`, the LoRA factors frozen; both restored on exit."""
        grads = [(p, p.requires_grad) for layer in self.layers.values() for p in (layer.B, layer.A)]
        for layer in self.layers.values():
            layer.dropout.train()
        if not lora:
            for p, _ in grads:
                p.requires_grad_(False)
        try:
            yield
        finally:
            for layer in self.layers.values():
                layer.dropout.eval()
            for p, requires_grad in grads:
                p.requires_grad_(requires_grad)

    @contextmanager
    def _seeded(self, seed: int | None) -> Iterator[None]:
        """The model device's global RNG seeded with `seed` inside the block and restored after it (None: as is)."""
        if seed is None:
            yield
            return
        cuda = self.device.type == "cuda"
        with torch.random.fork_rng(devices=[self.device] if cuda else [], device_type="cuda"):
            torch.default_generator.manual_seed(seed)
            if cuda:
                with torch.cuda.device(self.device):
                    torch.cuda.manual_seed(seed)
            yield

    @torch.no_grad()
    def evaluate(self, delta: dict[str, np.ndarray], head: Params) -> dict[str, float]:
        """Metric and loss of the model W0 + delta (LoRA off) on the held-out set: accuracy, cross-entropy and
        `metric` for classification; `metric` (Pearson correlation by default) and MSE for regression."""
        self.load(None, head, 1.0, delta)
        logits = torch.cat([self.forward(self.test.x[s:s + self.eval_batch_size]).cpu()
                            for s in range(0, len(self.test), self.eval_batch_size)])
        preds = logits[:, 0] if self.regression else logits.argmax(-1)
        out = {} if self.regression else {"accuracy": float((preds == self.test.y).double().mean())}
        out["loss"] = float(self._criterion(logits, self.test.y))
        if self.metric is not None:
            out[self.metric[0]] = self.metric[1](preds.numpy(), self.test.y.numpy())
        return out


def _same_base(jobs: Sequence[LocalJob]) -> bool:
    """Whether every job trains on the same dense base (None, or equal arrays per layer)."""
    first = jobs[0].base
    if first is None:
        return all(job.base is None for job in jobs)
    same = lambda base: base is not None and all(base[n] is b or np.array_equal(base[n], b)  # noqa: E731
                                                 for n, b in first.items())
    return all(same(job.base) for job in jobs[1:])


def _array(t: Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()
