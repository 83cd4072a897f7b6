"""E1 on commonsense reasoning (Table 5.2) on a causal LM, when its data is configured."""

from __future__ import annotations

import torch

from collabalign.data import iid
from collabalign.experiments.fslora.config import Config
from collabalign.experiments.fslora.runner import METHODS, Runner
from collabalign.experiments.fslora.scores import PAPER_TABLE_5_2, E1Scores, score_table
from collabalign.methods.fslora.commonsense import commonsense_problem
from collabalign.models.backbones import load_backbone
from collabalign.seeding import Seeds


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
