"""A GLUE task as a LoRA problem of the family (`TorchLoRAProblem`): frozen lower blocks computed once per text,
LoRA on the top blocks, a fresh linear head on mean-pooled states."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from collabalign.data.glue import glue_metric
from collabalign.data.hub import load_glue_any
from collabalign.methods.fslora.problems import ClassificationData, LocalSGD, TorchLoRAProblem
from collabalign.models.backbones import Backbone
from collabalign.models.cached import CachedModel, cache_texts, lora_top_blocks
from collabalign.models.pooled import PooledModel
from collabalign.seeding import Seeds


@dataclass(frozen=True)
class GlueSetup:
    """A GLUE task as a LoRA problem: LoRA of global rank `rank` on `targets` of the top `lora_blocks` blocks,
    `max_train` training examples, `max_test` dev rows (a seeded subset; all when None), texts cut at `max_length`
    tokens, LoRA dropout `dropout` (the backbone's own dropout stays off)."""

    rank: int
    sgd: LocalSGD
    max_train: int
    max_length: int = 64
    lora_blocks: int = 1
    targets: Sequence[str] = ("query", "value")
    max_test: int | None = None
    device: str = "cpu"
    dropout: float = 0.0
    pair_max_length: int | None = None  # text pairs cut at this many tokens instead (None: max_length)
    segments: bool = False  # text pairs with segment ids (the second text is segment 1)
    min_words: int = 0  # training texts (single-text tasks) with fewer words are left out: SST-2's phrases
    precision: str = "float32"  # bfloat16: the LoRA blocks' and head's matrix products under autocast (PRECISIONS)

    def length(self, pairs: bool) -> int:
        """Tokens a text (or, with `pairs`, a text pair) is cut at."""
        return (self.pair_max_length or self.max_length) if pairs else self.max_length


def glue_problem(task: str, root: Path | None, backbone: Backbone, setup: GlueSetup,
                 seeds: Seeds) -> tuple[TorchLoRAProblem, ClassificationData]:
    """A GLUE task (root/<task>/ tsv files, else the hub: load_glue_any) as a LoRA problem with one output per
    class (one score, trained as a regression, for STS-B): `max_train` training examples (a seeded subset of the
    train split when it is larger), the dev split (`max_test` of its rows, seeded, if given) as the test set, LoRA on
    an eval-mode copy of the backbone, a fresh linear head on mean-pooled states; returns (problem, training data)."""
    train_set, dev_set = load_glue_any(task, "train", root), load_glue_any(task, "dev", root)
    if setup.max_test is not None and setup.max_test < len(dev_set.labels):  # a seeded subset: dev files are sorted
        rows = np.sort(seeds.numpy("glue-dev-subset", task).permutation(len(dev_set.labels))[:setup.max_test])
        dev_set = replace(dev_set, text_a=[dev_set.text_a[i] for i in rows], labels=dev_set.labels[rows],
                          text_b=None if dev_set.text_b is None else [dev_set.text_b[i] for i in rows])
    usable = np.arange(len(train_set))
    if setup.min_words and train_set.text_b is None:
        usable = np.array([i for i, t in enumerate(train_set.text_a) if len(t.split()) >= setup.min_words])
    keep = np.sort(usable[seeds.numpy("glue-subset", task).permutation(len(usable))[:setup.max_train]])
    pick = (lambda xs, rows: [xs[i] for i in rows])
    text_a = pick(train_set.text_a, keep) + dev_set.text_a
    text_b = pick(train_set.text_b, keep) + dev_set.text_b if train_set.text_b is not None else None
    pooled = PooledModel(copy.deepcopy(backbone.model).eval(), backbone.causal, train_set.num_labels)  # caller's stays
    split = lora_top_blocks(pooled, setup.lora_blocks, setup.targets, setup.rank, dropout=setup.dropout)
    cache = cache_texts(pooled, backbone.tokenizer, text_a, setup.length(text_b is not None), split, text_b,
                        truncation_side="right", segments=setup.segments)
    model = CachedModel(pooled.to(setup.device), cache)
    labels = torch.from_numpy(np.concatenate([train_set.labels[keep], dev_set.labels]))
    rows = torch.arange(len(labels))
    data = ClassificationData(rows, labels)
    test = data[len(keep):]
    metric = None if dev_set.metric == "accuracy" else (dev_set.metric, lambda p, y: glue_metric(task, p, y))
    problem = TorchLoRAProblem(model, ["pooled.head.weight", "pooled.head.bias"], test, setup.sgd, metric,
                               device=setup.device, precision=setup.precision)
    return problem, data[: len(keep)]
