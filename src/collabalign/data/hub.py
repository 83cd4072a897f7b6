"""Online loaders from the Hugging Face hub, converted to the local loaders' types (needs the optional `datasets`),
and GLUE from local files where they are, else the hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from collabalign.data.glue import TextDataset, glue_layout, load_glue
from collabalign.data.hh_rlhf import hh_pair
from collabalign.data.preferences import PreferenceSet, collect_pairs

# GLUE task -> (hub config, first text column, second text column or None, dev split); hub labels match ours.
_GLUE_HUB = {
    "CoLA": ("cola", "sentence", None, "validation"),
    "SST-2": ("sst2", "sentence", None, "validation"),
    "MRPC": ("mrpc", "sentence1", "sentence2", "validation"),
    "RTE": ("rte", "sentence1", "sentence2", "validation"),
    "STS-B": ("stsb", "sentence1", "sentence2", "validation"),
    "QNLI": ("qnli", "question", "sentence", "validation"),
    "QQP": ("qqp", "question1", "question2", "validation"),
    "MNLI": ("mnli", "premise", "hypothesis", "validation_matched"),
}


def load_hub_dataset(name: str, config: str | None, split: str) -> Any:
    """One split of a hub dataset; imports `datasets` only when called, with an actionable message when it is
    missing."""
    try:
        from datasets import load_dataset
    except ImportError as err:
        raise ImportError(
            "loading from the Hugging Face hub needs the optional `datasets` package (pip install datasets); "
            "offline, use the local-file loaders (load_hh_rlhf, load_glue, load_pairs) on ../shared/data instead"
        ) from err
    return load_dataset(name, config, split=split)


def hh_rlhf_from_hub(split: str = "test", drop_invalid: bool = True) -> PreferenceSet:
    """Anthropic/hh-rlhf (all subsets) split as load_hh_rlhf does; a few hub rows are malformed, hence counted drops."""
    rows = load_hub_dataset("Anthropic/hh-rlhf", None, split)
    source = f"hub:Anthropic/hh-rlhf[{split}]"
    return collect_pairs(
        source, enumerate(rows, start=1), lambda i, r: [hh_pair(r["chosen"], r["rejected"], source, i)], drop_invalid
    )


def glue_from_hub(task: str, split: str = "dev") -> TextDataset:
    """nyu-mll/glue for one task ("dev": the hub's validation(_matched)), as the same TextDataset load_glue returns."""
    layout = glue_layout(task)
    config, a, b, dev = _GLUE_HUB[task]
    if split not in ("train", "dev"):
        raise ValueError(f"unknown GLUE split {split!r}; expected 'train' or 'dev' (test splits have no labels)")
    rows = load_hub_dataset("nyu-mll/glue", config, dev if split == "dev" else split)
    dtype = np.float32 if layout.num_labels == 1 else np.int64
    return TextDataset(
        list(rows[a]),
        list(rows[b]) if b else None,
        np.asarray(rows["label"], dtype),
        layout.num_labels,
        task,
        layout.metric,
    )


def load_glue_any(task: str, split: str, root: str | Path | None) -> TextDataset:
    """The task's local tsv files when root/<task>/ exists (load_glue), else its copy on the hub (glue_from_hub)."""
    if root is not None and (Path(root) / task).is_dir():
        return load_glue(task, split, root)
    try:
        return glue_from_hub(task, split)
    except ImportError as err:
        where = "no GLUE root" if root is None else f"no folder {Path(root) / task}"
        raise ImportError(f"GLUE {task}: {where} holding its tsv files, so it is loaded from the hub: {err}") from err
