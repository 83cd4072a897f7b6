"""The quickstart's preference pairs (HH-RLHF harmless pairs, the user's JSONL, or synthetic pairs) and the keys
its clients are split by."""

from __future__ import annotations

import sys

import numpy as np

from collabalign.data import PreferenceSet, attribute_labels, load_hh_rlhf, shared_data_dir, tiny_preferences
from collabalign.data.formats import load_pairs
from collabalign.data.hh_rlhf import HH_FILE
from collabalign.experiments.quickstart.config import Config
from collabalign.seeding import Seeds


def preference_data(cfg: Config, notes: list[str]) -> PreferenceSet:
    """HH-RLHF harmless pairs from the shared data (invalid rows dropped and counted), the JSONL at `data.path`
    (every row must carry the split attribute; a bad row is a DataError), or the synthetic set."""
    data_cfg, root = cfg.data, shared_data_dir()
    if data_cfg.source == "jsonl":
        data = load_pairs(data_cfg.path, require=(cfg.split.attribute,))
        notes.append(f"Data: {len(data)} preference pairs from {data_cfg.path}.")
    elif data_cfg.source == "hh-rlhf" and root is not None and (root / HH_FILE).exists():
        data = load_hh_rlhf(root / HH_FILE, drop_invalid=True)
        notes.append(f"Data: {len(data)} valid pairs from {HH_FILE}; dropped rows: {data.dropped or 'none'}.")
    else:
        if data_cfg.source == "hh-rlhf":
            msg = "shared HH-RLHF data not found (../shared/data or $COLLABALIGN_DATA): running on synthetic pairs"
            print(f"quickstart: {msg}", file=sys.stderr)
            notes.append(f"**Fallback:** {msg}; numbers below are not HH-RLHF results.")
        data = tiny_preferences(data_cfg.synthetic_pairs, Seeds(0).numpy("synthetic-data"))
        notes.append(f"Data: {len(data)} synthetic polite-vs-rude pairs (tiny_preferences).")
    if data_cfg.max_pairs is not None:
        data = PreferenceSet(data.pairs[: data_cfg.max_pairs], data.dropped, data.source)
    return data


def split_labels(pairs: PreferenceSet, attribute: str) -> np.ndarray:
    """Each pair's key of the clients' split: its `user` (a JSONL row's party) for "user", else the pair's attribute
    (a name some pair lacks is a DataError naming the attributes every pair has)."""
    if attribute == "user" and all(p.party is not None for p in pairs):
        return np.array([p.party for p in pairs])
    return np.array(attribute_labels(pairs, attribute))
