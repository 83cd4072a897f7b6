"""Preference and text data: validated loaders (local files or the hub), partitioners and synthetic sets."""

from collabalign.data.commonsense import COMMONSENSE_TASKS, extract_answer, load_commonsense, load_commonsense_test
from collabalign.data.errors import DataError
from collabalign.data.glue import GLUE_TASKS, TextDataset, glue_metric, glue_path, load_glue
from collabalign.data.hh_rlhf import TOPIC_KEYWORDS, hh_attributes, load_hh_rlhf
from collabalign.data.hub import glue_from_hub, hh_rlhf_from_hub, load_glue_any
from collabalign.data.partition import by_key, dirichlet, iid, label_skew
from collabalign.data.paths import shared_data_dir
from collabalign.data.preferences import PreferencePair, PreferenceSet, attribute_labels
from collabalign.data.synthetic import SYNTHETIC_TOPICS, tiny_preferences
from collabalign.data.tldr import (
                                   load_tldr,
                                   load_tldr_users,
                                   tldr_comparisons_from_hub,
                                   tldr_prompt,
                                   tldr_split,
                                   tldr_texts,
)

__all__ = [
    "COMMONSENSE_TASKS",
    "GLUE_TASKS",
    "SYNTHETIC_TOPICS",
    "TOPIC_KEYWORDS",
    "DataError",
    "PreferencePair",
    "PreferenceSet",
    "TextDataset",
    "attribute_labels",
    "by_key",
    "dirichlet",
    "extract_answer",
    "glue_from_hub",
    "glue_metric",
    "glue_path",
    "hh_attributes",
    "hh_rlhf_from_hub",
    "iid",
    "label_skew",
    "load_commonsense",
    "load_commonsense_test",
    "load_glue",
    "load_glue_any",
    "load_hh_rlhf",
    "load_tldr",
    "load_tldr_users",
    "shared_data_dir",
    "tiny_preferences",
    "tldr_comparisons_from_hub",
    "tldr_prompt",
    "tldr_split",
    "tldr_texts",
]
