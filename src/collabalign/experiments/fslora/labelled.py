"""The user's labelled-text JSONL as a task of FSLoRA's GLUE part: its rows split (seeded) into training rows and a
dev split, on the same LoRA classifier as a GLUE task."""

from __future__ import annotations

import copy

import numpy as np
import torch

from collabalign.data.errors import DataError
from collabalign.data.formats import load_labelled
from collabalign.experiments.fslora.config import LabelledJsonl
from collabalign.methods.fslora.glue import GlueSetup
from collabalign.methods.fslora.problems import ClassificationData, TorchLoRAProblem
from collabalign.models.backbones import Backbone
from collabalign.models.cached import CachedModel, cache_texts, lora_top_blocks
from collabalign.models.pooled import PooledModel
from collabalign.seeding import Seeds


def jsonl_problem(data: LabelledJsonl, backbone: Backbone,
                  setup: GlueSetup) -> tuple[TorchLoRAProblem, ClassificationData]:
    """The JSONL's rows as a LoRA problem built as `glue_problem` builds a GLUE task (an eval-mode copy of the
    backbone, a fresh linear head on mean-pooled states; classes, or one score for float labels): `dev_fraction` of
    the rows (seeded; the first `max_test` of them when set) are the test set, `max_train` of the others the
    training data it returns."""
    texts = load_labelled(data.path)
    order = Seeds(0).numpy("jsonl-dev", data.name).permutation(len(texts))
    n_dev = round(data.dev_fraction * len(texts))
    if not 0 < n_dev < len(texts):
        raise DataError(data.path, None, None, f"{len(texts)} rows: too few to hold out dev_fraction "
                                               f"{data.dev_fraction} and keep rows to train on")
    train, dev = np.sort(order[n_dev:][:setup.max_train]), np.sort(order[:n_dev][:setup.max_test])
    rows = np.concatenate([train, dev])
    pooled = PooledModel(copy.deepcopy(backbone.model).eval(), backbone.causal, texts.num_labels)  # caller's stays
    split = lora_top_blocks(pooled, setup.lora_blocks, setup.targets, setup.rank, dropout=setup.dropout)
    second = None if texts.text_b is None else [texts.text_b[i] for i in rows]
    cache = cache_texts(pooled, backbone.tokenizer, [texts.text_a[i] for i in rows], setup.length(second is not None),
                        split, second, truncation_side="right", segments=setup.segments)
    examples = ClassificationData(torch.arange(len(rows)), torch.from_numpy(texts.labels[rows]))
    problem = TorchLoRAProblem(CachedModel(pooled.to(setup.device), cache), ["pooled.head.weight", "pooled.head.bias"],
                               examples[len(train):], setup.sgd, device=setup.device, precision=setup.precision)
    return problem, examples[:len(train)]
