"""FSLoRA reproduction (spec ../shared/specs/fslora.md §8.4): E1 main comparison with the heterogeneous-rank
baselines (+ FedLoRA at rank r as reference) on the synthetic teacher–student problem and GLUE tasks with
all-MiniLM-L6-v2; E2 equal upload budget; E3 sketch-ratio ablation; E4 global-rank ablation; E5 top-k + sketch;
E6 device and server time. Every baseline uses the same per-device ranks."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from collabalign.config import Strict, validate
from collabalign.data import dirichlet, iid, shared_data_dir
from collabalign.federation import SimulationResult, simulate
from collabalign.lora import inject_lora
from collabalign.methods.fslora import FedStackLoRA, FlexLoRA, ServerAdam, device_ranks, fedlora, fslora, heterolora
from collabalign.methods.fslora.common import head_of
from collabalign.methods.fslora.commonsense import commonsense_problem
from collabalign.methods.fslora.problems import ClassificationData, TorchLoRAProblem, glue_problem, teacher_student
from collabalign.methods.fslora.theory import check_bias, check_rate, check_ratio_ordering, check_speedup
from collabalign.models.backbones import load_backbone
from collabalign.plotting import line_plot
from collabalign.runs import RunDir, claim
from collabalign.seeding import Seeds

TITLE = "FSLoRA: federated sketching LoRA vs heterogeneous-rank baselines"
METHODS = ("fedlora", "fslora", "heterolora", "flexlora", "fedstack")
HETERO = ("fslora", "heterolora", "flexlora", "fedstack")
# Table 5.1 (RoBERTa-base, r = 64, 200 rounds x 50 steps), by score key
_TABLE_5_1_COLUMNS = ("QNLI", "MRPC", "CoLA (accuracy)", "MNLI", "RTE", "SST-2", "QQP")
PAPER_TABLE = {m: dict(zip(_TABLE_5_1_COLUMNS, row, strict=True)) for m, row in {
    "heterolora": (87.5, 84.4, 75.3, 66.3, 69.0, 89.5, 85.3),
    "flexlora": (88.5, 81.2, 77.5, 63.0, 62.2, 92.8, 87.4),
    "fedstack": (87.2, 78.1, 77.4, 74.6, 54.4, 93.4, 87.1),
    "fslora": (88.0, 87.3, 82.2, 76.4, 69.8, 93.5, 85.8)}.items()}


class SyntheticConfig(Strict):
    n_train: int = 1000  # data-scarce: ~50 samples per device, the regime the paper motivates
    n_test: int = 4000
    dim: int = 64
    classes: int = 10
    update_rank: int = 24
    lr: float = 0.1
    extra_lrs: list[float] = [0.05, 0.2]  # E1 repeated at these step sizes: the ordering is regime-dependent


class GlueConfig(Strict):
    tasks: list[str] = []
    backbone: str = "minilm-l6"  # or any Hugging Face encoder name / path, e.g. roberta-base as in the paper
    max_train: int = 2000
    max_length: int = 64
    lora_blocks: int = 1  # LoRA in the top N blocks; the blocks below run once, as cached features
    targets: list[str] = ["query", "value"]
    lr: float = 0.5
    device: str = "cpu"
    # (lr, momentum, lora_alpha) settings run with FSLoRA on the first task and seed before E1: how much LoRA adds
    sensitivity: list[tuple[float, float, float]] = []
    federation: dict[str, float | int] = {}  # overrides of the federation section for GLUE, e.g. {rounds: 10}


class CommonsenseConfig(Strict):
    """Commonsense170K training, per-task LLM-Adapters test sets; runs E1 when both paths are given."""

    train_file: str | None = None  # LLM-Adapters' ft-training_set/commonsense_170k.json
    test_root: str | None = None  # LLM-Adapters' dataset/ folder, holding <task>/test.json
    tasks: list[str] = ["boolq", "piqa", "social_i_qa", "hellaswag", "winogrande", "ARC-Challenge", "ARC-Easy",
                        "openbookqa"]
    backbone: str = "tiny-llama"  # any causal LM name or path, e.g. meta-llama/Llama-3.2-3B-Instruct
    max_train: int | None = None  # None: all of Commonsense170K
    max_test: int | None = None  # None: every test row of each task
    max_length: int = 256
    max_new_tokens: int = 10
    targets: list[str] = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
    lr: float = 3e-4
    device: str = "cpu"


class FederationConfig(Strict):
    devices: int = 20
    alpha: float = 0.5  # Dirichlet label split; the paper's code uses 0.1 (see notes)
    min_size: int = 8
    rank: int = 32
    ratios: list[float] = [0.125, 0.25, 0.5, 0.75]
    steps: int = 10
    batch_size: int = 16
    rounds: int = 30
    eval_every: int = 5
    lora_alpha: float = 1.0
    momentum: float = 0.0  # local SGD momentum (fresh each round); the authors' GLUE code uses 0.9, eq. 4 none
    server_opt: Literal["sgd", "adam"] = "sgd"  # sgd = eq. 5; adam = the authors' code (FSLoRA/FedLoRA/HeteroLoRA)
    server_lr: float = 5e-4
    flexlora_sigma: Literal["B", "sqrt"] = "B"  # where FlexLoRA's singular values go (the code: all into B)


class AblationConfig(Strict):
    run: bool = True
    budget_ranks: list[int] = [8, 16, 32]
    budget_ratio: float = 0.5
    ratio_grid: list[float] = [0.125, 0.25, 0.5, 1.0]
    rank_grid: list[int] = [4, 8, 16, 32]
    fixed_k: int = 4
    top_k: float = 0.5
    top_k_rounds: int = 10  # at ratio 1; a run at ratio q gets rounds / q (equal upload)


class TheoryConfig(Strict):
    run: bool = True
    rate_rounds: list[int] = [50, 100, 200, 400, 800]
    speedup_rounds: int = 2000
    bias_rounds: int = 2000


class Config(Strict):
    seeds: list[int] = [0, 1, 2]
    synthetic: SyntheticConfig = SyntheticConfig()
    glue: GlueConfig = GlueConfig()
    commonsense: CommonsenseConfig = CommonsenseConfig()
    federation: FederationConfig = FederationConfig()
    ablations: AblationConfig = AblationConfig()
    theory: TheoryConfig = TheoryConfig()
    timing_reps: int = 5  # E6: interleaved repetitions of 2 rounds per method


def synthetic_problem(cfg: SyntheticConfig, fed: FederationConfig, seed: int, rank: int,
                      lr: float) -> tuple[TorchLoRAProblem, ClassificationData]:
    """The §8.2 teacher–student MLP with LoRA on its hidden layer; the pretrained head stays frozen."""
    student, train, test = teacher_student(Seeds(seed), cfg.n_train, cfg.n_test, cfg.dim, cfg.classes,
                                           cfg.update_rank)
    inject_lora(student, ["hidden"], rank)
    return TorchLoRAProblem(student, [], test, fed.steps, lr, fed.batch_size, momentum=fed.momentum), train


def build(method: str, problem: TorchLoRAProblem, ranks: dict[str, int], rank: int, fed: FederationConfig,
          top_k: float | None = None):
    alpha = fed.lora_alpha
    adam = ServerAdam(fed.server_lr) if fed.server_opt == "adam" else None
    return {"fedlora": lambda: fedlora(problem, list(ranks), rank, alpha, top_k, adam),
            "fslora": lambda: fslora(problem, ranks, rank, alpha, upload_top_k=top_k, server_adam=adam),
            "heterolora": lambda: heterolora(problem, ranks, rank, alpha, adam),
            "flexlora": lambda: FlexLoRA(problem, ranks, rank, alpha, fed.flexlora_sigma),
            "fedstack": lambda: FedStackLoRA(problem, ranks, rank, alpha)}[method]()


def devices(train: ClassificationData, fed: FederationConfig, seed: int) -> dict[str, ClassificationData]:
    parts = dirichlet(train.y.numpy(), fed.devices, fed.alpha, Seeds(seed).numpy("partition"), fed.min_size)
    return {f"device{i:02d}": train[torch.as_tensor(p)] for i, p in enumerate(parts)}


class Runner:
    """Runs one method on one problem and seed, recording per-round metrics and timing."""

    def __init__(self, fed: FederationConfig, progress: bool, records: list[dict] | None = None):
        self.fed, self.progress = fed, progress
        self.records: list[dict] = [] if records is None else records  # shared by runners of one experiment

    def run(self, tag: dict, problem: TorchLoRAProblem, clients: dict, method: str, rank: int,
            ratios: list[float], seed: int, rounds: int, top_k: float | None = None) -> SimulationResult:
        ranks = device_ranks(Seeds(seed), list(clients), rank, ratios)
        algorithm = build(method, problem, ranks, rank, self.fed, top_k)
        label = " ".join(f"{v}" for v in tag.values()) + f" {method} seed {seed}"
        result = simulate(algorithm, clients, rounds, seed, eval_every=self.fed.eval_every, progress=self.progress,
                          label=label)
        delta = algorithm.delta_weights(result.state)
        without = problem.evaluate({n: np.zeros_like(d) for n, d in delta.items()}, head_of(result.state))
        result.metrics[-1]["score_without_lora"] = headline(without)  # the trained head alone
        result.metrics[-1]["delta_w_rel_norm"] = float(np.mean([np.linalg.norm(d) / float(torch.linalg.norm(
            problem.w0[n])) for n, d in delta.items()]))  # mean over adapted layers of ||Delta W|| / ||W0||
        uploaded = result.ledger.per_round()
        cumulative = np.cumsum([uploaded[t]["up"] for t in sorted(uploaded)]) / len(clients) / 1e6
        for rec in result.metrics:
            mb = float(cumulative[rec["round"] - 1]) if rec["round"] else 0.0
            self.records.append({**tag, "method": method, "seed": seed, "upload_mb_per_device": round(mb, 6), **rec})
        return result


def headline(metrics: dict) -> float:
    """A metrics record's headline in points: Matthews correlation for CoLA, else accuracy."""
    return 100 * metrics.get("matthews", metrics["accuracy"])


def score(result: SimulationResult) -> float:
    """The final round's headline metric in points."""
    return headline(result.metrics[-1])


def glue_sensitivity(cfg: Config, runner: Runner, task: str, problem: TorchLoRAProblem,
                     train: ClassificationData) -> str:
    """FSLoRA on one GLUE task and seed under each (lr, momentum, lora_alpha) setting; returns a markdown table of
    the score, the same head's score with Delta W = 0, and ||Delta W|| / ||W0|| (mean over adapted layers)."""
    seed, lines, fed = cfg.seeds[0], [], runner.fed
    clients = devices(train, fed, seed)
    for lr, momentum, alpha in cfg.glue.sensitivity:
        setting = Runner(fed.model_copy(update={"momentum": momentum, "lora_alpha": alpha}), runner.progress,
                         runner.records)
        problem.lr, problem.momentum = lr, momentum
        result = setting.run({"experiment": "GLUE sensitivity", "problem": task, "variant": f"{lr}/{momentum}/{alpha}"},
                             problem, clients, "fslora", setting.fed.rank, setting.fed.ratios, seed, setting.fed.rounds)
        final = result.metrics[-1]
        lines.append(f"| {lr:g} | {momentum:g} | {alpha:g} | {score(result):.1f} | "
                     f"{final['score_without_lora']:.1f} | {final['delta_w_rel_norm']:.4f} |")
    problem.lr, problem.momentum = cfg.glue.lr, fed.momentum
    return "\n".join([f"GLUE sensitivity: FSLoRA on {task}, seed {seed}, {fed.rounds} rounds of H = {fed.steps} (the "
                      f"E1 setting is lr {cfg.glue.lr}, momentum {fed.momentum}, alpha {fed.lora_alpha}):",
                      "", "| lr | momentum | lora_alpha | score | same head, Delta W = 0 | "
                      "norm(Delta W)/norm(W0) |", "|---|---|---|---|---|---|", *lines])


class E1Results:
    """Per (problem, method): final scores and LoRA's share of them (the score minus that of the same head with
    Delta W = 0), per seed; per method: (device s, server s) of each timed run."""

    def __init__(self) -> None:
        self.scores: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.gains: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.timing: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def record(self, problem: str, method: str, result: SimulationResult, timed: bool = True) -> None:
        final = result.metrics[-1]
        self.scores[problem, method].append(score(result))
        self.gains[problem, method].append(score(result) - final["score_without_lora"])
        if "matthews" in final:  # the paper reports plain accuracy for CoLA too
            self.scores[f"{problem} (accuracy)", method].append(100 * final["accuracy"])
        for key in final:
            if key.startswith("accuracy/"):  # per-task accuracy of a multi-task problem (commonsense)
                self.scores[f"{problem}/{key[len('accuracy/'):]}", method].append(100 * final[key])
        if timed:
            self.timing[method].append(_times(result))


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    fed, abl, runner = cfg.federation, cfg.ablations, Runner(cfg.federation, progress)
    glue_runner = Runner(validate(FederationConfig, fed.model_dump() | cfg.glue.federation, "glue.federation"),
                         progress, runner.records)
    notes = [f"{fed.devices} devices, Dirichlet(alpha={fed.alpha}) label split (min {fed.min_size} per device); "
             f"global rank r = {fed.rank}; device ratios drawn once per device from {fed.ratios}; H = {fed.steps} "
             f"SGD steps (momentum {fed.momentum}) of batch {fed.batch_size} per round; server step "
             f"{'eq. 5' if fed.server_opt == 'sgd' else f'Adam lr {fed.server_lr}'}; LoRA scale alpha/sqrt(r), "
             f"alpha = {fed.lora_alpha}; seeds {cfg.seeds}. The paper's code splits with alpha 0.1: with 20 devices "
             "and 2 labels a per-label Dirichlet(0.1) split leaves devices without data, so alpha is stated here."]
    e1 = E1Results()
    scores, gains, timing = e1.scores, e1.gains, e1.timing
    problems = [("synthetic", cfg.synthetic.lr)] + [(f"synthetic lr={lr}", lr) for lr in cfg.synthetic.extra_lrs]
    for name, lr in problems:
        for seed in cfg.seeds:
            problem, train = synthetic_problem(cfg.synthetic, fed, seed, fed.rank, lr)
            clients = devices(train, fed, seed)
            for method in METHODS:
                e1.record(name, method, runner.run({"experiment": "E1", "problem": name}, problem, clients, method,
                                                   fed.rank, fed.ratios, seed, fed.rounds), timed=name == "synthetic")
    shared = shared_data_dir()
    glue_root = None if shared is None else shared / "glue"  # tasks without a folder there come from the hub
    backbone = load_backbone(cfg.glue.backbone) if cfg.glue.tasks else None
    gfed = glue_runner.fed
    if cfg.glue.federation:
        notes.append(f"GLUE overrides of the above: {cfg.glue.federation}.")
    for task in cfg.glue.tasks:
        problem, train = glue_problem(task, glue_root, backbone, Seeds(0), gfed.rank, cfg.glue.max_train,
                                      cfg.glue.max_length, cfg.glue.lora_blocks, cfg.glue.targets, gfed.steps,
                                      cfg.glue.lr, gfed.batch_size, device=cfg.glue.device, momentum=gfed.momentum)
        if task == cfg.glue.tasks[0] and cfg.glue.sensitivity:
            notes.append(glue_sensitivity(cfg, glue_runner, task, problem, train))
        for seed in cfg.seeds:
            clients = devices(train, gfed, seed)
            for method in METHODS:
                e1.record(task, method, glue_runner.run({"experiment": "E1", "problem": task}, problem, clients,
                                                        method, gfed.rank, gfed.ratios, seed, gfed.rounds))
    main_problems = ["synthetic", *cfg.glue.tasks]
    if cfg.commonsense.train_file is not None and cfg.commonsense.test_root is not None:
        main_problems.append(commonsense_e1(cfg, runner, e1, notes))
    e6 = e6_timing(cfg, cfg.timing_reps)
    claims = [e1_claim(scores, main_problems), e6_claim(e6)]
    metrics = {"E1": {f"{p}/{m}": dict(zip(("mean", "std"), mean_std(v), strict=True))
                      for (p, m), v in scores.items()},
               "E1_lora_gain_points": {f"{p}/{m}": round(float(np.mean(v)), 2) for (p, m), v in gains.items()},
               "E6_seconds_per_round_interleaved": {m: {k: round(x, 5) for k, x in v.items()} for m, v in e6.items()},
               "E1_seconds_per_run": {m: dict(zip(("device", "server"), np.mean(v, axis=0).round(3).tolist(),
                                                  strict=True)) for m, v in timing.items()},
               "paper_table_5_1": PAPER_TABLE}
    if abl.run:
        claims += ablations(cfg, runner, metrics, run_dir.path / "plots")
    if cfg.theory.run:
        claims += theory_claims(cfg, metrics)
    run_dir.write_metrics(runner.records)
    plot_e1(runner.records, run_dir, [p for p, _ in problems] + main_problems[1:])
    table_rows = [p for p, _ in problems] + [r for t in main_problems[1:] for r in (t, f"{t} (accuracy)")
                                             if (r, "fslora") in scores]
    notes.append(score_table(scores, [(r, r) for r in table_rows], PAPER_TABLE,
                             "E1 final scores (mean ± std over seeds; GLUE: accuracy, CoLA: Matthews corr. x 100, and "
                             "its accuracy on its own row, which is what the paper reports; paper = RoBERTa-base "
                             "Table 5.1, a much larger budget):"))
    notes.append(gain_table(gains, table_rows))
    run_dir.write_summary(claims, metrics, notes=notes, plot_metrics=[])


def commonsense_e1(cfg: Config, runner: Runner, e1: E1Results, notes: list[str]) -> str:
    """E1 on commonsense reasoning (Table 5.2): IID shards of Commonsense170K (the authors' code), every method and
    seed; scores the plain mean over tasks as problem "commonsense" and each task as "commonsense/<task>"."""
    cs, fed = cfg.commonsense, cfg.federation
    problem, train = commonsense_problem(cs.train_file, cs.test_root, cs.tasks, load_backbone(cs.backbone), Seeds(0),
                                         fed.rank, cs.max_train, cs.max_test, cs.max_length, cs.targets, fed.steps,
                                         cs.lr, fed.batch_size, cs.max_new_tokens, cs.device, fed.momentum)
    for seed in cfg.seeds:
        parts = iid(len(train), fed.devices, Seeds(seed).numpy("partition"))
        clients = {f"device{i:02d}": train[torch.as_tensor(p)] for i, p in enumerate(parts)}
        for method in METHODS:
            e1.record("commonsense", method, runner.run({"experiment": "E1", "problem": "commonsense"}, problem,
                                                         clients, method, fed.rank, fed.ratios, seed, fed.rounds))
    rows = [(task, f"commonsense/{task}") for task in cs.tasks] + [("mean", "commonsense")]
    notes.append(score_table(e1.scores, rows, PAPER_TABLE_5_2,
                             f"E1 commonsense accuracy ({cs.backbone}; IID shards of Commonsense170K; greedy "
                             "generation + answer extraction; mean ± std over seeds; paper = LLaMA-3.2-3B, "
                             "Table 5.2):"))
    return "commonsense"


# Table 5.2 (LLaMA-3.2-3B, r = 64, 750 rounds x 20 steps), by score key; "commonsense" = the paper's Avg.
_TABLE_5_2_COLUMNS = tuple(f"commonsense/{t}" for t in ("ARC-Challenge", "ARC-Easy", "boolq", "hellaswag",
                                                         "openbookqa", "piqa", "social_i_qa", "winogrande")) + (
    "commonsense",)
PAPER_TABLE_5_2 = {m: dict(zip(_TABLE_5_2_COLUMNS, row, strict=True)) for m, row in {
    "heterolora": (69.2, 84.6, 68.4, 80.0, 69.9, 77.3, 68.7, 72.0, 73.8),
    "flexlora": (69.9, 84.7, 66.9, 80.5, 72.3, 78.1, 70.4, 73.3, 74.5),
    "fedstack": (67.5, 83.1, 65.8, 78.4, 69.2, 75.5, 67.1, 71.5, 72.3),
    "fslora": (73.8, 86.2, 68.5, 83.1, 78.7, 82.0, 75.8, 74.8, 77.9)}.items()}


def _times(result: SimulationResult) -> tuple[float, float]:
    return sum(t["client_s"] for t in result.timing), sum(t["server_s"] for t in result.timing)


def e1_claim(scores: dict, problems: list[str]) -> dict:
    """FSLoRA's average over problems (per seed) against the best other heterogeneous-rank method's; decided
    only when the gain is more than two standard errors over seeds from zero."""
    avg = {m: np.mean([scores[p, m] for p in problems], axis=0) for m in METHODS}
    rival = max((m for m in HETERO if m != "fslora"), key=lambda m: avg[m].mean())
    diff = avg["fslora"] - avg[rival]
    se = float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0
    gain = float(diff.mean())
    verdict = "reproduced" if gain > max(2 * se, 0) else "not reproduced" if gain < -2 * se else "inconclusive"
    return claim("FSLoRA has the best average accuracy among the heterogeneous-rank methods", verdict,
                 {"problems": problems, "fslora": round(float(avg["fslora"].mean()), 2),
                  "best_other": rival, "best_other_score": round(float(avg[rival].mean()), 2),
                  "gain_points": round(gain, 2), "se_over_seeds": round(se, 2),
                  "fedlora_reference": round(float(avg["fedlora"].mean()), 2)},
                 "FSLoRA above HeteroLoRA, FlexLoRA and FedStackLoRA on average (paper: 83.3 vs <= 79.6)")


def e6_timing(cfg: Config, reps: int) -> dict[str, dict[str, float]]:
    """Per-round device and server seconds of each method on the synthetic problem (seed of the first run), as
    medians over `reps` repetitions in which the methods take turns (2 rounds each), so machine noise hits all
    alike; evaluation is not timed."""
    fed, seed = cfg.federation, cfg.seeds[0]
    problem, train = synthetic_problem(cfg.synthetic, fed, seed, fed.rank, cfg.synthetic.lr)
    clients = devices(train, fed, seed)
    ranks = device_ranks(Seeds(seed), list(clients), fed.rank, fed.ratios)
    samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for _ in range(reps):
        for method in METHODS:
            result = simulate(build(method, problem, ranks, fed.rank, fed), clients, 2, seed, eval_every=2,
                              progress=False)
            samples[method] += [(t["client_s"], t["server_s"]) for t in result.timing]
    return {m: {"device": float(np.median([d for d, _ in v])), "server": float(np.median([s for _, s in v]))}
            for m, v in samples.items()}


def e6_claim(per_round: dict[str, dict[str, float]]) -> dict:
    device = {m: v["device"] for m, v in per_round.items()}
    total = {m: v["device"] + v["server"] for m, v in per_round.items()}
    ratio_hetero = device["fslora"] / device["heterolora"]
    cheaper = total["fslora"] < min(total["flexlora"], total["fedstack"])
    verdict = "reproduced" if abs(ratio_hetero - 1) <= 0.15 and cheaper else "not reproduced"
    return claim("FSLoRA's compute is about HeteroLoRA's and below FlexLoRA's and FedStackLoRA's", verdict,
                 {"device_fslora_over_heterolora": round(ratio_hetero, 3),
                  **{f"total_{m}_over_fslora": round(total[m] / total["fslora"], 3) for m in ("flexlora", "fedstack")},
                  **{f"server_{m}_over_fslora": round(per_round[m]["server"] / per_round["fslora"]["server"], 2)
                     for m in ("flexlora", "fedstack")}},
                 "per-round device time within 15% of HeteroLoRA's; device + server time below FlexLoRA's and "
                 "FedStackLoRA's (medians of interleaved rounds on the synthetic problem)")


def final_scores(runner: Runner, tag: dict, problem, clients, method, rank, ratios, seeds, rounds, top_k=None):
    return [score(runner.run(tag, problem, clients, method, rank, ratios, s, rounds, top_k)) for s in seeds]


def ablations(cfg: Config, runner: Runner, metrics: dict, plots: Path) -> list[dict]:
    """E2–E5 on the synthetic problem, every run over all seeds; their plots go to `plots`."""
    fed, abl, syn = cfg.federation, cfg.ablations, cfg.synthetic
    results: dict[str, dict] = {"E2": {}, "E3": {}, "E4": {}, "E5": {}}

    def runs(tag, rank, ratios, rounds, method="fslora", top_k=None):
        out = []
        for seed in cfg.seeds:
            problem, train = synthetic_problem(syn, fed, seed, rank, syn.lr)
            out.append(score(runner.run(tag, problem, devices(train, fed, seed), method, rank, ratios, seed, rounds,
                                        top_k)))
        return float(np.mean(out))
    for r in abl.budget_ranks:
        results["E2"][f"r={r}"] = {
            "unsketched": runs({"experiment": "E2", "variant": f"r={r} unsketched"}, r, [1.0], fed.rounds, "fedlora"),
            "sketched": runs({"experiment": "E2", "variant": f"r={r} ratio={abl.budget_ratio}"}, r,
                             [abl.budget_ratio], round(fed.rounds / abl.budget_ratio))}
    for q in abl.ratio_grid:
        results["E3"][q] = runs({"experiment": "E3", "variant": f"ratio={q}"}, fed.rank, [q], fed.rounds)
    for r in abl.rank_grid:
        results["E4"][r] = runs({"experiment": "E4", "variant": f"r={r}"}, r, [abl.fixed_k / r], fed.rounds)
    for q in abl.ratio_grid:
        results["E5"][q] = runs({"experiment": "E5", "variant": f"ratio={q} top-k={abl.top_k}"}, fed.rank, [q],
                                round(abl.top_k_rounds / q), top_k=abl.top_k)
    plot_ablations(results, runner.records, plots)
    metrics["ablations"] = {k: {str(kk): (round(vv, 2) if isinstance(vv, float) else vv) for kk, vv in v.items()}
                            for k, v in results.items()}
    e2 = {k: round(v["sketched"] - v["unsketched"], 2) for k, v in results["E2"].items()}
    e3 = [results["E3"][q] for q in sorted(abl.ratio_grid)]
    e4 = [results["E4"][r] for r in sorted(abl.rank_grid)]
    e5 = [results["E5"][q] for q in sorted(abl.ratio_grid)]
    monotone = (lambda xs, up: all(b >= a for a, b in zip(xs, xs[1:], strict=False)) if up
                else all(b <= a for a, b in zip(xs, xs[1:], strict=False)))
    verdict = (lambda ok: "reproduced" if ok else "not reproduced")
    return [
        claim("Under an equal upload budget, sketching beats no sketching at every global rank",
              verdict(all(v > 0 for v in e2.values())), {"sketched_minus_unsketched_points": e2},
              f"FSLoRA at ratio {abl.budget_ratio} with {1 / abl.budget_ratio:g}x the rounds above FedLoRA, each r"),
        claim("At fixed r and rounds, a smaller sketching ratio is (slightly) worse", verdict(monotone(e3, True)),
              {"score_by_ratio": dict(zip(map(str, sorted(abl.ratio_grid)), np.round(e3, 2).tolist(), strict=True))},
              "accuracy non-decreasing in the ratio"),
        claim("At fixed device rank k, a larger global rank r helps", verdict(monotone(e4, True)),
              {"score_by_r": dict(zip(map(str, sorted(abl.rank_grid)), np.round(e4, 2).tolist(), strict=True))},
              f"accuracy non-decreasing in r at k = {abl.fixed_k}"),
        claim("With top-k upload compression, lower sketching ratios do better at equal upload",
              verdict(monotone(e5, False)),
              {"score_by_ratio": dict(zip(map(str, sorted(abl.ratio_grid)), np.round(e5, 2).tolist(), strict=True))},
              f"top-k {abl.top_k}; equal uploaded MB per device; accuracy non-increasing in the ratio"),
    ]


def plot_ablations(results: dict, records: list[dict], plots: Path) -> None:
    """E2–E4 score against rank or ratio; E5 score against cumulative upload per device (mean over seeds)."""
    e2 = results["E2"]
    ranks = [int(k[2:]) for k in e2]
    line_plot(plots / "E2_equal_budget.png", {v: (ranks, [e2[k][v] for k in e2]) for v in ("unsketched", "sketched")},
              "global rank r", "score (points)", "E2: equal upload budget", log_x=True)
    line_plot(plots / "E3_ratio.png", {"fslora": (sorted(results["E3"]), [results["E3"][q] for q in
                                                                         sorted(results["E3"])])},
              "sketching ratio k/r", "score (points)", "E3: sketching ratio at fixed r", log_x=True)
    line_plot(plots / "E4_global_rank.png", {"fslora": (sorted(results["E4"]), [results["E4"][r] for r in
                                                                               sorted(results["E4"])])},
              "global rank r", "score (points)", "E4: global rank at fixed k", log_x=True)
    curves = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("experiment") == "E5":
            curves[r["variant"]][r["round"]].append((r["upload_mb_per_device"], 100 * r["accuracy"]))
    series = {v: ([float(np.mean([x for x, _ in by[t]])) for t in sorted(by)],
                  [float(np.mean([y for _, y in by[t]])) for t in sorted(by)]) for v, by in curves.items()}
    line_plot(plots / "E5_topk_upload.png", series, "uploaded MB per device", "score (points)",
              "E5: top-k + sketching, accuracy vs upload")


def plot_e1(records: list[dict], run_dir: RunDir, problems: list[str]) -> None:
    """Accuracy (or Matthews corr.) per round, mean over seeds, one PNG per E1 problem."""
    for problem in problems:
        by = defaultdict(lambda: defaultdict(list))
        for r in records:
            if r.get("experiment") == "E1" and r["problem"] == problem:
                by[r["method"]][r["round"]].append(100 * r.get("matthews", r["accuracy"]))
        series = {m: (sorted(v), [float(np.mean(v[t])) for t in sorted(v)]) for m, v in by.items()}
        slug = problem.replace(" ", "_").replace("=", "")
        line_plot(run_dir.path / "plots" / f"E1_{slug}.png", series, "round", "score (points)", f"E1: {problem}")


def score_table(scores: dict, rows: list[tuple[str, str]], paper: dict, caption: str) -> str:
    """Markdown table of (label, score key) rows: mean ± std over seeds per method, the paper's number beside."""
    lines = [caption, "", "| problem | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    for label, key in rows:
        cells = []
        for m in METHODS:
            mu, sd = mean_std(scores[key, m])
            number = paper.get(m, {}).get(key)
            cells.append(f"{mu:.1f} ± {sd:.1f}" + (f" (paper {number})" if number is not None else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gain_table(gains: dict, problems: list[str]) -> str:
    """Markdown table of how much LoRA adds: the final score minus that of the same trained head on the frozen
    backbone (Delta W = 0), mean over seeds. Near zero means the head, not the adapter, decided the score."""
    lines = ["LoRA's share of E1: final score minus the score of the same head with Delta W = 0 (points, mean over "
             "seeds):", "", "| problem | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    lines += [f"| {p} | " + " | ".join(f"{np.mean(gains[p, m]):+.1f}" for m in METHODS) + " |"
              for p in problems if (p, METHODS[0]) in gains]
    return "\n".join(lines)


def theory_claims(cfg: Config, metrics: dict) -> list[dict]:
    """§7.5 checks on the exact sketched objective of a small matrix regression (theory.py)."""
    c1 = check_ratio_ordering(cfg.seeds)
    c2 = check_rate(cfg.seeds, cfg.theory.rate_rounds)
    c3 = check_speedup(cfg.seeds, rounds=cfg.theory.speedup_rounds)
    c5 = check_bias(cfg.seeds, rounds=cfg.theory.bias_rounds)
    metrics["theory"] = _finite({"C1": c1, "C2": c2, "C3": c3, "C5": c5})
    verdict = (lambda ok: "reproduced" if ok else "not reproduced")
    rounded = (lambda d: {str(k): round(v, 4) if np.isfinite(v) else "diverged" for k, v in d.items()})
    return [
        claim("Theory C1: the stationarity gap grows as the sketching ratio falls (fixed step size)",
              verdict(c1["increasing_as_ratio_falls"]),
              {"avg_grad_sq_by_ratio": rounded(c1["avg_grad_sq"]), "diverged_seeds": c1["diverged_seeds"]},
              "mean ||grad f^S||^2 increasing as k/r falls (divergence at the smallest ratio allowed: gamma ~ k/r)"),
        claim("Theory C2: rate O(1/sqrt(T)) (Corollary 4.5)", verdict(c2["in_band"]),
              {"slope": round(c2["slope"], 3), "rounds": c2["rounds"]},
              "slope of log mean ||grad f^S||^2 vs log T in [-0.65, -0.35] (the 1/sqrt(T) step size builds much of "
              "this in)"),
        claim("Theory C3: linear speedup in the number of devices", verdict(c3["slope_all_rounds"] < -0.4),
              {"slope_all_rounds": round(c3["slope_all_rounds"], 3), "slope_last_half": round(c3["slope_last_half"], 3),
               "n_devices": c3["n_devices"]},
              "slope vs log N below -0.4 over all rounds (about -1 for the last-half floor, IID, H = 1)"),
        claim("Theory C5: FSLoRA solves the sketched objective, so f stalls above FedLoRA's as the ratio falls",
              verdict(c5["floor_grows_as_ratio_falls"] and c5["f_plain"][1.0] < 0.01 * min(
                  v for q, v in c5["f_plain"].items() if q < 1)),
              {"f_by_ratio": rounded(c5["f_plain"]), "f_sketched_by_ratio": rounded(c5["f_sketched"])},
              "noise-free: FedLoRA's f under 1% of every sketched run's; floor increasing as k/r falls"),
    ]


def _finite(value):
    """Non-finite floats (diverged runs) as None, so summary.json stays strict JSON."""
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not np.isfinite(value) else value
