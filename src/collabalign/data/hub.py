"""Online loaders from the Hugging Face hub, converted to the local loaders' types (needs the optional `datasets`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from collabalign.data.glue import TextDataset, glue_layout
from collabalign.data.hh_rlhf import hh_pair
from collabalign.data.preferences import PreferencePair, PreferenceSet, checked_pair, collect_pairs

# GLUE task -> (hub config, first text column, second text column or None); hub labels already match ours.
_GLUE_HUB = {
    "CoLA": ("cola", "sentence", None),
    "SST-2": ("sst2", "sentence", None),
    "MRPC": ("mrpc", "sentence1", "sentence2"),
    "RTE": ("rte", "sentence1", "sentence2"),
    "STS-B": ("stsb", "sentence1", "sentence2"),
}


def _load_dataset(name: str, config: str | None, split: str) -> Any:
    """Import `datasets` only when a hub loader is called, with an actionable message when it is missing."""
    try:
        from datasets import load_dataset
    except ImportError as err:
        raise ImportError(
            "loading from the Hugging Face hub needs the optional `datasets` package (pip install datasets); "
            "offline, use the local-file loaders (load_hh_rlhf, load_glue, load_jsonl) on ../shared/data instead"
        ) from err
    return load_dataset(name, config, split=split)


def hh_rlhf_from_hub(split: str = "test", drop_invalid: bool = True) -> PreferenceSet:
    """Anthropic/hh-rlhf (all subsets) split as load_hh_rlhf does; a few hub rows are malformed, hence counted drops."""
    rows = _load_dataset("Anthropic/hh-rlhf", None, split)
    source = f"hub:Anthropic/hh-rlhf[{split}]"
    return collect_pairs(
        source, enumerate(rows, start=1), lambda i, r: [hh_pair(r["chosen"], r["rejected"], source, i)], drop_invalid
    )


def glue_from_hub(task: str, split: str = "dev") -> TextDataset:
    """nyu-mll/glue for one task ("dev" means the hub's "validation"), as the same TextDataset load_glue returns."""
    layout = glue_layout(task)
    config, a, b = _GLUE_HUB[task]
    rows = _load_dataset("nyu-mll/glue", config, "validation" if split == "dev" else split)
    dtype = np.float32 if layout.num_labels == 1 else np.int64
    return TextDataset(
        list(rows[a]),
        list(rows[b]) if b else None,
        np.asarray(rows["label"], dtype),
        layout.num_labels,
        task,
        layout.metric,
    )


def tldr_comparisons_from_hub(split: str = "validation", drop_invalid: bool = True) -> PreferenceSet:
    """openai/summarize_from_feedback comparisons (Reddit TL;DR): party = the labeler's `worker` id."""
    rows = _load_dataset("openai/summarize_from_feedback", "comparisons", split)
    source = f"hub:openai/summarize_from_feedback/comparisons[{split}]"

    def make(i: int, r: dict[str, Any]) -> list[PreferencePair]:
        info, texts = r["info"], [s["text"] for s in r["summaries"]]
        post = info.get("post") or info.get("article") or ""
        prompt = f"SUBREDDIT: r/{info.get('subreddit')}\nTITLE: {info.get('title')}\nPOST: {post}\nTL;DR:"
        attributes = {"subreddit": info.get("subreddit"), "policies": [s["policy"] for s in r["summaries"]]}
        return [checked_pair(source, i, prompt, texts[r["choice"]], texts[1 - r["choice"]], r["worker"], attributes)]

    return collect_pairs(source, enumerate(rows, start=1), make, drop_invalid)
