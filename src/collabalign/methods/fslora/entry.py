"""FSLoRA and its heterogeneous-rank family, the entry point: labelled text (JSONL or a loaded `TextDataset`), any
Hugging Face model, devices of different LoRA ranks; the server's global LoRA classifier and each device's rank-k_i
slice of it back. The LoRA variants built for averaging (FFA-LoRA, FedSA-LoRA, FedEx-LoRA) run every device at the
global rank (`ranks` then only counts the devices).

    from collabalign.methods.fslora import FSLoRAConfig, train_fslora
    result = train_fslora(FSLoRAConfig(model="minilm-l6", ranks=[2, 4, 8], rounds=10), "labelled.jsonl")
    result.save("runs/fslora")  # adapters/global (rank lora.rank), adapters/device-<i> (rank k_i), each with its head
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.artifacts import Result
from collabalign.baselines import compare, label_probe
from collabalign.config import ConfigError, LoRASection, Strict
from collabalign.data.formats import file_hash, json_hash, load_labelled
from collabalign.data.glue import TextDataset
from collabalign.data.partition import iid
from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.federation.protocol import ClientContext
from collabalign.federation.server_opt import ServerOptimizer
from collabalign.federation.simulator import simulate
from collabalign.lora.targets import default_targets
from collabalign.methods.fslora.common import ServerAdam, head_of, server_rule
from collabalign.methods.fslora.fedex import FedExLoRA
from collabalign.methods.fslora.fedlora import fedlora
from collabalign.methods.fslora.fedsa import FedSALoRA
from collabalign.methods.fslora.ffalora import ffalora
from collabalign.methods.fslora.flexlora import FlexLoRA
from collabalign.methods.fslora.heterolora import heterolora
from collabalign.methods.fslora.problems import ClassificationData, Factors, LocalSGD, TorchLoRAProblem
from collabalign.methods.fslora.sketch import SubspaceLoRA, fslora
from collabalign.models.backbones import Backbone
from collabalign.models.cached import CachedModel, TextCache, cache_texts, frozen_features, lora_top_blocks
from collabalign.models.pooled import PooledModel
from collabalign.models.saved import base_prefix, own_backbone, pooled_adapter
from collabalign.seeding import Seeds
from collabalign.selection import best, held_out_slice

Method = Literal["fslora", "heterolora", "flexlora", "fedlora", "ffa-lora", "fedsa-lora", "fedex-lora"]
View = tuple[Factors, float]  # an adapter as the method uses it: factors per layer and the LoRA scale
Family = SubspaceLoRA | FlexLoRA | FedExLoRA | FedSALoRA
STEPPED = ("fslora", "heterolora", "fedlora", "ffa-lora", "fedsa-lora")  # methods a server optimiser can step
LR_GRID = (3e-4, 1e-3, 3e-3, 1e-2)  # `lr: auto`'s AdamW rates: the GLUE main form's grid
SELECT_FRACTION = 0.2  # of the training examples, held out to choose the rate on


class FSLoRAConfig(Strict):
    """Federated LoRA text classification (or regression) over devices of different ranks: FSLoRA or a method of the
    family it is compared with. The LoRA scale is alpha / sqrt(lora.rank) (rsLoRA) for every method and device."""

    model: str = "minilm-l6"
    method: Method = "fslora"
    lora: LoRASection = LoRASection(rank=8, alpha=8.0, blocks=3)  # rank: the server's global rank r
    ranks: list[PositiveInt] = Field([2, 4, 8], min_length=1)  # one device per entry: its rank k_i <= lora.rank
    rounds: PositiveInt = 10
    local_steps: PositiveInt = 8
    batch_size: PositiveInt = 16
    optimizer: Literal["adamw", "sgd"] = "adamw"  # each device's, its state fresh every round
    lr: PositiveFloat | Literal["auto"] = "auto"  # auto: chosen from LR_GRID on a slice of the training examples
    momentum: float = Field(0.0, ge=0, lt=1)  # sgd only: momentum, fresh every round
    server_lr: PositiveFloat | None = None  # the authors' code's server Adam at this lr; None: eq. 5's mean step
    server_optimizer: ServerOptimizer | None = None  # or a federation.server_opt rule (not fedprox, scaffold)
    max_length: PositiveInt = 64
    test_fraction: float = Field(0.2, ge=0, lt=1)  # examples held out for the reported accuracy (Pearson)
    seed: NonNegativeInt = 0
    engine: EngineOptions = EngineOptions()

    @model_validator(mode="after")
    def _consistent(self) -> FSLoRAConfig:
        if max(self.ranks) > self.lora.rank:
            raise ValueError(f"device ranks {self.ranks} must be at most the global rank lora.rank={self.lora.rank}")
        stepped = self.server_lr is not None or (self.server_optimizer is not None and not self.server_optimizer.plain)
        if stepped and self.method not in STEPPED:
            raise ValueError(f"server_lr and server_optimizer apply to {', '.join(STEPPED)}, not {self.method} (its "
                             "server keeps a product of the factors, not the factors it averages)")
        if self.server_lr is not None and self.server_optimizer is not None:
            raise ValueError("set server_lr (the authors' server Adam) or server_optimizer, not both")
        if self.server_optimizer is not None:
            server_rule(self.server_optimizer)  # fedprox and scaffold: refused with one line
        if self.momentum and self.optimizer != "sgd":
            raise ValueError("momentum is for optimizer: sgd (AdamW keeps its own moments)")
        return self


def train_fslora(config: FSLoRAConfig, data: str | Path | TextDataset, model: Backbone | str | None = None,
                 progress: bool = False) -> Result:
    """Trains the global LoRA classifier over `len(config.ranks)` devices (an iid split of the training examples);
    the held-out score and per-round metrics are in `result.metrics`, the adapters in `result.adapters` ("global",
    "device-<i>"); `result.model` is the pooled model with the global adapter loaded. With `lr: auto` the rate is
    chosen first (`choose_lr`; `metrics["lr_selection"]`)."""
    return fslora_job(config, data, model, select=True).run(progress)


def fslora_job(config: FSLoRAConfig, data: str | Path | TextDataset, model: Backbone | str | None = None,
               select: bool = False) -> FederatedJob:
    """The run `train_fslora` simulates, for any engine. `lr: auto` is chosen here only with `select` (in process,
    before the run): a job built elsewhere (a deployment's server and nodes) needs a number."""
    if config.lr == "auto" and not select:
        raise ConfigError("lr: auto chooses the rate by training in process (train_fslora, collabalign train); a "
                          "deployment needs a number, e.g. lr: 0.001")
    texts, data_hash = _labelled(data)
    backbone, name = own_backbone(model, config.model, ("max_length", config.max_length))
    seeds = Seeds(config.seed)
    pooled = PooledModel(backbone.model.eval(), backbone.causal, texts.num_labels, seeds.torch("head"))
    targets = default_targets(backbone.model, config.lora.targets)
    split = lora_top_blocks(pooled, config.lora.blocks or 10**6, targets, config.lora.rank,
                            dropout=config.lora.dropout)
    cache = cache_texts(pooled, backbone.tokenizer, texts.text_a, config.max_length, split, texts.text_b)
    every = ClassificationData(torch.arange(len(texts)), torch.from_numpy(texts.labels))
    order = seeds.numpy("test-split").permutation(len(texts))
    n_test = round(config.test_fraction * len(texts))
    test_rows, train_rows = np.sort(order[:n_test]), np.sort(order[n_test:])
    sgd = LocalSGD(config.local_steps, 0.0 if config.lr == "auto" else config.lr, config.batch_size,
                   config.momentum, optimizer=config.optimizer)
    problem = TorchLoRAProblem(CachedModel(pooled, cache), ["pooled.head.weight", "pooled.head.bias"],
                               every[torch.from_numpy(test_rows if n_test else train_rows)], sgd)
    selection = None
    if config.lr == "auto":
        selection = choose_lr(config, problem, every, train_rows, seeds)
        problem.sgd = replace(sgd, lr=selection["chosen"])
    clients = _devices(config, every, train_rows, seeds)
    method = _algorithm(config, problem, dict(zip(clients, config.ranks, strict=True)))

    def finish(sim: SimulationResult) -> Result:
        metrics = {"rounds": sim.metrics, "devices": len(clients), "ranks": config.ranks,
                   "train_examples": len(train_rows), "test_examples": n_test, "bytes": sim.ledger.total(),
                   "lr": problem.sgd.lr, **({"lr_selection": selection} if selection else {})}
        if n_test:
            metrics.update({k: v for k, v in sim.metrics[-1].items() if k != "round"})
        head, prefix = head_of(sim.state), base_prefix(backbone.model)
        adapters, views = {}, _device_views(method, sim, config.rounds + 1, list(clients))
        for i, (factors, scale) in enumerate(views):
            problem.load(factors, head, scale, None)  # the layers now run the device's block at its scale
            adapters[f"device-{i}"] = pooled_adapter(pooled, prefix, name)
        if not isinstance(method, FedSALoRA):  # FedSA-LoRA has no global model: result.model is the last device's
            factors, scale = _global_view(method, sim.state)
            problem.load(factors, head, scale, None)  # last: result.model is the global classifier
            adapters["global"] = pooled_adapter(pooled, prefix, name)
        if n_test:  # the model result.model holds against a probe on the frozen features
            metrics["baseline"] = probe_baseline(problem, backbone, name, cache, texts.labels, train_rows, test_rows,
                                                 seeds)
        return Result(config.method, "classifier", name, config.model_dump(), data_hash, metrics, adapters,
                      max_length=config.max_length, model=pooled)

    return FederatedJob(config.method, method, clients, config.rounds, config.seed, config.engine, finish)


def _devices(config: FSLoRAConfig, every: ClassificationData, rows: np.ndarray, seeds: Seeds) -> dict:
    """The devices' data: an iid split of `rows` over `len(config.ranks)` devices."""
    parts = iid(len(rows), len(config.ranks), seeds.numpy("devices"))
    return {f"device{i}": every[torch.from_numpy(rows[p])] for i, p in enumerate(parts)}


def choose_lr(config: FSLoRAConfig, problem: TorchLoRAProblem, every: ClassificationData, train_rows: np.ndarray,
              seeds: Seeds) -> dict:
    """`lr: auto`: the whole federated run once per rate of `LR_GRID` on the training examples less a held-out
    `SELECT_FRACTION` (seeded), each scored on that slice by the problem's metric (accuracy; Pearson for a
    regression), the best kept (`selection.best`: ties to the smaller rate). The test examples are never seen."""
    fit, chosen_on = (train_rows[r.numpy()] for r in held_out_slice(np.zeros(len(train_rows)), SELECT_FRACTION,
                                                                      seeds.numpy("fslora/select")))
    clients = _devices(config, every, fit, seeds)
    metric = problem.metric[0] if problem.metric else "accuracy"
    test, sgd, scores = problem.test, problem.sgd, {}
    problem.test = every[torch.from_numpy(chosen_on)]
    try:
        for lr in LR_GRID:
            problem.sgd = replace(sgd, lr=lr)
            method = _algorithm(config, problem, dict(zip(clients, config.ranks, strict=True)))
            sim = simulate(method, clients, config.rounds, config.seed, eval_every=config.rounds, progress=False)
            scores[lr] = float(sim.metrics[-1].get(metric, float("nan")))
    finally:
        problem.test, problem.sgd = test, sgd
    return {"grid": list(LR_GRID), "metric": metric, "scores": {f"{lr:g}": s for lr, s in scores.items()},
            "chosen": best(scores), "examples": len(chosen_on)}


def probe_baseline(problem: TorchLoRAProblem, backbone: Backbone, name: str, cache: TextCache, labels: np.ndarray,
                   train_rows: np.ndarray, test_rows: np.ndarray, seeds: Seeds) -> dict:
    """The classifier as loaded in `problem` against a logistic probe (a ridge probe for regression) on the frozen
    backbone's features of the training examples, on the same held-out examples (`baselines.compare`)."""
    with torch.no_grad():
        out = torch.cat([problem.forward(problem.test.x[s:s + problem.eval_batch_size]).cpu()
                         for s in range(0, len(problem.test), problem.eval_batch_size)])
    y = problem.test.y
    ours = (out[:, 0] - y) ** 2 if problem.regression else (out.argmax(-1) == y).double()
    features = frozen_features(backbone.model, backbone.causal, cache).numpy()
    probe = label_probe(features, labels, train_rows, test_rows, seeds.numpy("baseline-probe"), problem.regression)
    what = "a ridge probe" if problem.regression else "a logistic probe"
    return compare("squared error" if problem.regression else "accuracy", ours.numpy(), probe,
                   f"{what} on frozen {name} features", lower_is_better=problem.regression)


def _labelled(data: str | Path | TextDataset) -> tuple[TextDataset, str]:
    """The labelled texts and the sha256 the manifest records (of the file, or of the loaded rows' JSON)."""
    if isinstance(data, str | Path):
        return load_labelled(data), file_hash(data)
    rows = [data.text_a, data.text_b, data.labels.tolist()]
    return data, json_hash(rows)


def _algorithm(config: FSLoRAConfig, problem: TorchLoRAProblem, ranks: dict[str, int]) -> Family:
    """The configured method over devices of these ranks, at global rank lora.rank."""
    rank, alpha, ids = config.lora.rank, config.lora.alpha, list(ranks)
    server = ServerAdam(config.server_lr) if config.server_lr is not None else server_rule(config.server_optimizer)
    if config.method == "fslora":
        return fslora(problem, ranks, rank, alpha, server=server)
    if config.method == "heterolora":
        return heterolora(problem, ranks, rank, alpha, server=server)
    if config.method == "fedlora":
        return fedlora(problem, ids, rank, alpha, server=server)
    if config.method == "ffa-lora":
        return ffalora(problem, ids, rank, alpha, server=server)
    if config.method == "fedsa-lora":
        return FedSALoRA(problem, ids, rank, alpha, server=server)
    if config.method == "fedex-lora":
        return FedExLoRA(problem, ids, rank, alpha)
    return FlexLoRA(problem, ranks, rank, alpha)


def _device_views(method: Family, sim: SimulationResult, round_: int, ids: list[str]) -> list[View]:
    """Each device's adapter of the final model, as the method hands it to the device in round `round_` (FSLoRA:
    that round's sketch, with the r/k_i factor; HeteroLoRA: the first k_i ranks; FlexLoRA: the rank-k_i SVD
    truncation; FedLoRA, FFA-LoRA: the global factors; FedEx-LoRA: the global model, base folded in; FedSA-LoRA:
    the shared A with the device's own B)."""
    if isinstance(method, FedExLoRA):
        return [_global_view(method, sim.state)] * len(ids)
    messages = method.configure(sim.state, round_, ids)
    clients = {cid: sim.clients.get(cid, ClientContext(cid, None)) for cid in ids}
    jobs = [method.local_job(messages[cid], clients[cid]) for cid in ids]
    return [(job.factors, float(job.scale)) for job in jobs]


def _global_view(method: Family, state: dict[str, np.ndarray]) -> View:
    """The server's model as LoRA: its rank-r factors; for FlexLoRA (the averaged update dW) and FedEx-LoRA (the
    base plus the factors' product) the dense update factored exactly (SVD) at its numerical rank."""
    shapes = method.problem.shapes
    if isinstance(method, SubspaceLoRA):
        return {n: (state[f"{n}.B"], state[f"{n}.A"]) for n in shapes}, method.scale
    return exact_factors(method.delta_weights(state)), 1.0


def exact_factors(dense: dict[str, np.ndarray]) -> Factors:
    """{layer: (B, A)} with B A = the layer's dense update, every layer at one rank (a PEFT adapter has one): the
    largest numerical rank over the layers (singular values above 1e-6 of the largest), zero-padded where a layer
    has fewer."""
    svds = {n: np.linalg.svd(d.astype(np.float64), full_matrices=False) for n, d in dense.items()}
    rank = max(1, *(int((s > 1e-6 * s[0]).sum()) if s.size and s[0] > 0 else 1 for _, s, _ in svds.values()))
    factors = {}
    for n, (u, sigma, vt) in svds.items():
        k = min(rank, len(sigma))
        b, a = np.zeros((u.shape[0], rank), np.float32), np.zeros((rank, vt.shape[1]), np.float32)
        b[:, :k], a[:k] = u[:, :k] * sigma[:k], vt[:k]
        factors[n] = (b, a)
    return factors
