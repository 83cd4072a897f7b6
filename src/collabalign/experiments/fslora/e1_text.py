"""E1 on text: GLUE tasks (Table 5.1) on a cached-feature encoder, with the GLUE sensitivity table run first, and
commonsense reasoning (Table 5.2) on a causal LM when its data is configured."""

from __future__ import annotations

import torch

from collabalign.data import iid, shared_data_dir
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.runner import METHODS, Runner, devices, score
from collabalign.experiments.fslora.scores import PAPER_TABLE_5_2, E1Scores, score_table
from collabalign.methods.fslora.commonsense import commonsense_problem
from collabalign.methods.fslora.problems import ClassificationData, TorchLoRAProblem, glue_problem
from collabalign.models.backbones import load_backbone
from collabalign.seeding import Seeds


def glue_e1(cfg: Config, e1: E1Scores, runner: Runner, notes: list[str]) -> None:
    """Every method and seed on each GLUE task under the runner's (GLUE) federation; the sensitivity table, when
    configured, on the first task before E1."""
    shared = shared_data_dir()
    root = None if shared is None else shared / "glue"  # tasks without a folder there come from the hub
    backbone = load_backbone(cfg.glue.backbone)
    setup = cfg.glue.setup(runner.fed)
    for task in cfg.glue.tasks:
        problem, train = glue_problem(task, root, backbone, setup, Seeds(0))
        if task == cfg.glue.tasks[0] and cfg.glue.sensitivity:
            notes.append(glue_sensitivity(cfg, runner, task, problem, train))
        for seed in cfg.seeds:
            clients = devices(train, runner.fed, seed)
            for method in METHODS:
                e1.record(task, method, runner.run({"experiment": "E1", "problem": task}, problem, clients,
                                                   runner.arm(method), seed))


def glue_sensitivity(cfg: Config, runner: Runner, task: str, problem: TorchLoRAProblem,
                     train: ClassificationData) -> str:
    """FSLoRA on one GLUE task and seed under each (lr, momentum, lora_alpha) setting; returns a markdown table of
    the score, the same head's score with Delta W = 0, and ||Delta W|| / ||W0|| (mean over adapted layers)."""
    seed, lines, fed, e1_sgd = cfg.seeds[0], [], runner.fed, problem.sgd
    clients = devices(train, fed, seed)
    for lr, momentum, alpha in cfg.glue.sensitivity:
        setting = Runner(fed.model_copy(update={"momentum": momentum, "lora_alpha": alpha}), runner.progress,
                         runner.records)
        problem.sgd = setting.fed.local_sgd(lr)
        result = setting.run({"experiment": "GLUE sensitivity", "problem": task, "variant": f"{lr}/{momentum}/{alpha}"},
                             problem, clients, setting.arm("fslora"), seed)
        final = result.metrics[-1]
        lines.append(f"| {lr:g} | {momentum:g} | {alpha:g} | {score(result):.1f} | "
                     f"{final['score_without_lora']:.1f} | {final['delta_w_rel_norm']:.4f} |")
    problem.sgd = e1_sgd
    return "\n".join([f"GLUE sensitivity: FSLoRA on {task}, seed {seed}, {fed.rounds} rounds of H = {fed.steps} (the "
                      f"E1 setting is lr {cfg.glue.lr}, momentum {fed.momentum}, alpha {fed.lora_alpha}):",
                      "", "| lr | momentum | lora_alpha | score | same head, Delta W = 0 | "
                      "norm(Delta W)/norm(W0) |", "|---|---|---|---|---|---|", *lines])


def commonsense_e1(cfg: Config, e1: E1Scores, runner: Runner, notes: list[str]) -> str:
    """E1 on commonsense reasoning (Table 5.2): IID shards of Commonsense170K (the authors' code), every method and
    seed; scores the plain mean over tasks as problem "commonsense" and each task as "commonsense/<task>"."""
    cs, fed = cfg.commonsense, runner.fed
    problem, train = commonsense_problem(cs.setup(fed), load_backbone(cs.backbone), Seeds(0))
    for seed in cfg.seeds:
        parts = iid(len(train), fed.devices, Seeds(seed).numpy("partition"))
        clients = {f"device{i:02d}": train[torch.as_tensor(p)] for i, p in enumerate(parts)}
        for method in METHODS:
            e1.record("commonsense", method, runner.run({"experiment": "E1", "problem": "commonsense"}, problem,
                                                         clients, runner.arm(method), seed))
    rows = [(task, f"commonsense/{task}") for task in cs.tasks] + [("mean", "commonsense")]
    notes.append(score_table(e1.scores, rows, PAPER_TABLE_5_2,
                             f"E1 commonsense accuracy ({cs.backbone}; IID shards of Commonsense170K; greedy "
                             "generation + answer extraction; mean ± std over seeds; paper = LLaMA-3.2-3B, "
                             "Table 5.2):"))
    return "commonsense"
