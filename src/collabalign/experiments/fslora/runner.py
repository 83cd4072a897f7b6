"""What every part of the FSLoRA reproduction shares: the synthetic problem, the device split, the methods by
name, and a runner that runs one method on one problem and seed and records its rounds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from collabalign.data import dirichlet
from collabalign.experiments.fslora.config import Config, FederationConfig, SyntheticConfig
from collabalign.experiments.fslora.teacher_student import teacher_student
from collabalign.federation import Algorithm, SimulationResult, simulate
from collabalign.federation.engine import EngineOptions, RoundFailed
from collabalign.lora import inject_lora
from collabalign.methods.fslora import (
    FedExLoRA,
    FedSALoRA,
    FedStackLoRA,
    FlexLoRA,
    ServerAdam,
    device_ranks,
    fedlora,
    ffalora,
    fslora,
    heterolora,
)
from collabalign.methods.fslora.common import head_of
from collabalign.methods.fslora.problems import ClassificationData, TorchLoRAProblem
from collabalign.runs import cached_json, fingerprint
from collabalign.seeding import Seeds

METHODS = ("fedlora", "fslora", "heterolora", "flexlora", "fedstack")
BASELINES = ("heterolora", "flexlora", "fedstack")  # the heterogeneous-rank methods FSLoRA is compared with
VARIANTS = ("ffa-lora", "fedsa-lora", "fedex-lora")  # LoRA variants built for averaging, every device at the rank


@dataclass(frozen=True)
class Arm:
    """One method at one setting: global rank, the ratios device ranks are drawn from, rounds, top-k upload; `name`
    labels its records when it is not the method's own (e.g. "centralised" for FedLoRA on one party)."""

    method: str
    rank: int
    ratios: Sequence[float]
    rounds: int
    top_k: float | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.method


@dataclass(frozen=True)
class RunSummary:
    """What a part keeps of one run: its metrics per evaluated round and its timing per round."""

    metrics: list[dict]
    timing: list[dict]


def synthetic_problem(cfg: SyntheticConfig, fed: FederationConfig, seed: int, rank: int,
                      lr: float) -> tuple[TorchLoRAProblem, ClassificationData]:
    """The §8.2 teacher–student MLP with LoRA on its hidden layer; the pretrained head stays frozen."""
    student, train, test = teacher_student(Seeds(seed), cfg.n_train, cfg.n_test, dim=cfg.dim, classes=cfg.classes,
                                           update_rank=cfg.update_rank)
    inject_lora(student, ["hidden"], rank)
    return TorchLoRAProblem(student, [], test, fed.local_sgd(lr)), train


def devices(train: ClassificationData, fed: FederationConfig, seed: int) -> dict[str, ClassificationData]:
    """The seed's Dirichlet label split of `train` over the federation's devices (scores: of their rounded value)."""
    labels = np.rint(train.y.numpy()).astype(int) if train.y.is_floating_point() else train.y.numpy()
    parts = dirichlet(labels, fed.devices, fed.alpha, Seeds(seed).numpy("partition"), fed.min_size)
    return {f"device{i:02d}": train[torch.as_tensor(p)] for i, p in enumerate(parts)}


def algorithm(arm: Arm, problem: TorchLoRAProblem, ranks: dict[str, int], fed: FederationConfig) -> Algorithm:
    """The arm's method with the given per-device ranks; every method uses the same ranks and LoRA scale."""
    alpha = fed.lora_alpha
    adam = ServerAdam(fed.server_lr) if fed.server_opt == "adam" else None
    if arm.method == "fedlora":
        return fedlora(problem, list(ranks), arm.rank, alpha, upload_top_k=arm.top_k, server=adam)
    if arm.method == "fslora":
        return fslora(problem, ranks, arm.rank, alpha, upload_top_k=arm.top_k, server=adam)
    if arm.method == "heterolora":
        return heterolora(problem, ranks, arm.rank, alpha, server=adam)
    if arm.method == "ffa-lora":
        return ffalora(problem, list(ranks), arm.rank, alpha, server=adam)
    if arm.method == "fedsa-lora":
        return FedSALoRA(problem, list(ranks), arm.rank, alpha, server=adam)
    if arm.method == "fedex-lora":
        return FedExLoRA(problem, list(ranks), arm.rank, alpha)
    if arm.method == "flexlora":
        return FlexLoRA(problem, ranks, arm.rank, alpha, sigma_split=fed.flexlora_sigma)
    if arm.method == "fedstack":
        return FedStackLoRA(problem, ranks, arm.rank, alpha)
    raise ValueError(f"unknown method {arm.method!r}; known: {METHODS + VARIANTS}")


def headline(metrics: dict) -> float:
    """A metrics record's headline in points: accuracy, as the paper reports for every task (STS-B: Pearson)."""
    return 100 * metrics.get("pearson", metrics.get("accuracy"))


def score(result: SimulationResult | RunSummary) -> float:
    """The final round's headline metric in points."""
    return headline(result.metrics[-1])


def run_cache(run_path: Path, part: str) -> Path:
    """Where a part's finished runs are saved ("synthetic" or "glue"), read back by a later run with the same
    settings: a stopped main run continues where it stopped, and its parts can be computed by separate processes."""
    return run_path / f"fslora_{part}_runs"


LEGACY_FEDERATION = {"optimizer": "sgd", "weight_decay": 0.0}  # added later: out of the key at these values


def federation_settings(fed: FederationConfig, engine: EngineOptions) -> dict:
    """The federation's settings with the engine's options under its key "engine", as the cached runs are keyed
    (settings added after runs were cached stay out of the key at the value those runs had)."""
    legacy = {k for k, v in LEGACY_FEDERATION.items() if getattr(fed, k) == v}
    return fed.model_dump(mode="json", exclude=legacy) | {"engine": engine.model_dump(mode="json")}


def synthetic_fingerprint(cfg: Config) -> str:
    """Every setting that changes a synthetic run's numbers (E1 and the ablations; not which seeds run)."""
    return fingerprint({"synthetic": cfg.synthetic.model_dump(mode="json"),
                        "federation": federation_settings(cfg.federation, cfg.engine),
                        "ablations": cfg.ablations.model_dump(mode="json")})


class Runner:
    """Runs one method on one problem and seed under federation `fed` with the engine options `engine`, appending its
    per-round records (with the cumulative upload per device) to `records`, which runners of one part may share. With
    a `cache` folder each run is saved there under `key` (every setting that changes its numbers) and read back when
    it finished before."""

    def __init__(self, fed: FederationConfig, engine: EngineOptions, progress: bool, records: list[dict] | None = None,
                 cache: Path | None = None, key: str = ""):
        self.fed, self.engine, self.progress, self.cache, self.key = fed, engine, progress, cache, key
        self.records: list[dict] = [] if records is None else records

    def variant(self, **federation) -> Runner:
        """A runner under the federation with these settings changed, sharing this one's records and cache."""
        return Runner(self.fed.model_copy(update=federation), self.engine, self.progress, self.records, self.cache,
                      self.key)

    def arm(self, method: str) -> Arm:
        """The method at the federation's own rank, ratios and rounds."""
        return Arm(method, self.fed.rank, self.fed.ratios, self.fed.rounds)

    def run(self, tag: dict, problem: TorchLoRAProblem, clients: dict, arm: Arm, seed: int) -> RunSummary:
        """The run's summary; RoundFailed when it diverged (saved like a finished run, so it is not run again)."""
        compute = partial(self._simulate_or_failure, tag, problem, clients, arm, seed)
        if self.cache is None:
            out = compute()
        else:
            name = "__".join(f"{v}" for v in (*tag.values(), arm.label, arm.rank, arm.rounds, f"seed{seed}"))
            out = cached_json(self.cache / f"{re.sub(r'[^A-Za-z0-9.=-]+', '_', name)}.json", self.key, compute)
        if "failed" in out:
            raise RoundFailed(out["failed"])
        self.records.extend(out["records"])
        return RunSummary(out["metrics"], out["timing"])

    def _simulate_or_failure(self, *args) -> dict:
        try:
            return self._simulate(*args)
        except RoundFailed as err:
            return {"failed": str(err)}

    def _simulate(self, tag: dict, problem: TorchLoRAProblem, clients: dict, arm: Arm, seed: int) -> dict:
        ranks = device_ranks(Seeds(seed), list(clients), arm.rank, arm.ratios)
        label = " ".join(f"{v}" for v in tag.values()) + f" {arm.label} seed {seed}"
        method = algorithm(arm, problem, ranks, self.fed)
        result = simulate(method, clients, arm.rounds, seed, eval_every=self.fed.eval_every, options=self.engine,
                          progress=self.progress, label=label)
        if not isinstance(method, FedSALoRA):  # FedSA-LoRA has no global model: its metrics are the devices' own
            delta = method.delta_weights(result.state)
            without = problem.evaluate({n: np.zeros_like(d) for n, d in delta.items()}, head_of(result.state))
            result.metrics[-1]["score_without_lora"] = headline(without)  # the trained head alone
            result.metrics[-1]["delta_w_rel_norm"] = float(np.mean([np.linalg.norm(d) / float(torch.linalg.norm(
                problem.w0[n])) for n, d in delta.items()]))  # mean over adapted layers of ||Delta W|| / ||W0||
        uploaded = result.ledger.per_round()
        cumulative = np.cumsum([uploaded[t]["up"] for t in sorted(uploaded)]) / len(clients) / 1e6
        records = []
        for rec in result.metrics:
            mb = float(cumulative[rec["round"] - 1]) if rec["round"] else 0.0
            records.append({**tag, "method": arm.label, "seed": seed, "upload_mb_per_device": round(mb, 6), **rec})
        return {"records": records, "metrics": result.metrics, "timing": result.timing}
