"""Reddit TL;DR comparisons (openai/summarize_from_feedback, subset `comparisons`) and the P-ShareLoRA users.

Rows are read in the Hugging Face schema: `info` {id, post, title, subreddit, article, ...}, `summaries` [{text, policy,
note}, ...] (two of them), `choice` (0/1: which summary the labeler preferred), `worker`, `batch`, `split`, `extra`
{confidence}. Users are formed as the paper's code does (docs/methods/pshare-lora.md §5): the top workers by train
count, each downsampled to the smallest of them with HF `Dataset.shuffle(seed)` semantics
(`np.random.default_rng(seed).permutation`), so the same rows in the same order give the paper's selection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from collabalign.data import hub
from collabalign.data.errors import DataError
from collabalign.data.jsonl import read_jsonl
from collabalign.data.preferences import PreferencePair, PreferenceSet, checked_pair, collect_pairs

HUB_NAME = "openai/summarize_from_feedback"
HUB_SUBSET = "comparisons"
SPLITS = ("train", "validation")
CNNDM = "no Reddit post (CNN/DM article)"
IDENTICAL = "identical summaries (no preference)"


def tldr_prompt(subreddit: str, title: str, post: str) -> str:
    """The paper's code's input text up to the summary: the summary is appended to it as is (no chat template)."""
    return f"SUBREDDIT: r/{subreddit}\nTITLE: {title}\nPOST: {post}\nTL;DR: "


def tldr_texts(pair: PreferencePair) -> tuple[str, str]:
    """The full (chosen, rejected) texts the reward model scores: prompt + summary, as the paper's code builds them."""
    return pair.prompt + pair.chosen, pair.prompt + pair.rejected


def tldr_pair(row: dict[str, Any], source: str | Path, line: int) -> PreferencePair | str:
    """One comparison row as a pair whose party is its `worker` id, or the reason it carries no Reddit preference.

    A row whose `info.post` is null but which has an `article` is a CNN/DM comparison (reason CNNDM); two identical
    summary texts are a tie (reason IDENTICAL). Anything else malformed raises a DataError naming the field.
    """
    info = _field(row, "info", dict, source, line)
    summaries = _field(row, "summaries", list, source, line)
    if len(summaries) != 2:
        raise DataError(source, line, "summaries", f"expected 2 summaries, got {len(summaries)}")
    texts = [_text(s, f"summaries[{i}].text", source, line) for i, s in enumerate(summaries)]
    if "choice" not in row:
        raise DataError(source, line, "choice", "missing field")
    choice = row["choice"]
    if type(choice) is not int or choice not in (0, 1):
        raise DataError(source, line, "choice", f"expected 0 or 1, got {choice!r}")
    worker = _text(row, "worker", source, line)
    if info.get("post") is None and isinstance(info.get("article"), str):
        return CNNDM
    post, title, subreddit = (_text(info, f"info.{k}", source, line) for k in ("post", "title", "subreddit"))
    if texts[0] == texts[1]:
        return IDENTICAL
    extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
    attributes = {
        "worker": worker,
        "post_id": info.get("id"),
        "subreddit": subreddit,
        "chosen_policy": summaries[choice].get("policy"),
        "rejected_policy": summaries[1 - choice].get("policy"),
        "batch": row.get("batch"),
        "confidence": extra.get("confidence"),
    }
    prompt = tldr_prompt(subreddit, title, post)
    return checked_pair(source, line, prompt, texts[choice], texts[1 - choice], worker, attributes)


def _field(obj: dict[str, Any], name: str, kind: type, source: str | Path, line: int) -> Any:
    """obj[name] when it is present and of the given type, else a DataError naming the field."""
    if name not in obj:
        raise DataError(source, line, name, "missing field")
    if not isinstance(obj[name], kind):
        raise DataError(source, line, name, f"not a {'JSON object' if kind is dict else 'list'}")
    return obj[name]


def _text(obj: Any, path: str, source: str | Path, line: int) -> str:
    """The non-blank string at the last part of a dotted field path (e.g. "summaries[1].text"), else a DataError."""
    key = path.rsplit(".", 1)[-1]
    if not isinstance(obj, dict):
        raise DataError(source, line, path.rsplit(".", 1)[0], "not a JSON object")
    if key not in obj:
        raise DataError(source, line, path, "missing field")
    if not isinstance(obj[key], str):
        raise DataError(source, line, path, "not a string")
    if not obj[key].strip():
        raise DataError(source, line, path, "empty text")
    return obj[key]


def tldr_rows(source: str | Path, records: Iterable[tuple[int, Any]], drop_invalid: bool = False) -> PreferenceSet:
    """Pairs from (line, row) records; CNN/DM and tied rows are always counted drops, malformed rows raise
    (or, with drop_invalid, are counted by field and message). An empty result is an error."""

    def make(line: int, row: Any) -> list[PreferencePair] | str:
        result = tldr_pair(row, source, line)
        return result if isinstance(result, str) else [result]

    return collect_pairs(source, records, make, drop_invalid)


def load_tldr(path: str | Path, drop_invalid: bool = False) -> PreferenceSet:
    """One local comparisons file (.jsonl, or gzipped whatever its name) in the Hugging Face row schema."""
    return tldr_rows(path, read_jsonl(path), drop_invalid)


def tldr_split(root: str | Path | None, split: str, drop_invalid: bool = False) -> PreferenceSet:
    """root/{split}.jsonl or root/{split}.jsonl.gz when present, else the split from the hub (needs `datasets`)."""
    if split not in SPLITS:
        raise ValueError(f"unknown TL;DR split {split!r}; expected one of {SPLITS}")
    if root is not None:
        for name in (f"{split}.jsonl", f"{split}.jsonl.gz"):
            if (Path(root) / name).is_file():
                return load_tldr(Path(root) / name, drop_invalid)
    try:
        return tldr_comparisons_from_hub(split, drop_invalid)
    except ImportError as err:
        where = "no root" if root is None else f"no {split}.jsonl(.gz) in {root}"
        raise ImportError(f"TL;DR comparisons: {where}, so the {split} split is loaded from the hub: {err}") from err


def tldr_comparisons_from_hub(split: str = "validation", drop_invalid: bool = True) -> PreferenceSet:
    """openai/summarize_from_feedback comparisons (Reddit TL;DR) as load_tldr reads them: party = the labeler's
    `worker` id; CNN/DM rows and ties are counted in `dropped`; malformed rows are counted too unless drop_invalid
    is False."""
    rows = hub.load_hub_dataset(HUB_NAME, HUB_SUBSET, split)
    return tldr_rows(f"hub:{HUB_NAME}/{HUB_SUBSET}[{split}]", enumerate(rows, start=1), drop_invalid)


def top_workers(pairs: PreferenceSet, n_workers: int) -> list[str]:
    """The n_workers parties with the most pairs, most first; equal counts keep first-appearance order (as the
    paper's code's stable sort does)."""
    counts = Counter(p.party for p in pairs)
    if len(counts) < n_workers:
        raise ValueError(f"{pairs.source}: only {len(counts)} workers, fewer than the {n_workers} asked for")
    return [str(w) for w, _ in sorted(counts.items(), key=lambda wc: -wc[1])[:n_workers]]


def balanced_users(
    pairs: PreferenceSet, workers: list[str], seed: int = 42, cap: int | None = None
) -> PreferenceSet:
    """Each worker's pairs downsampled to the smallest worker's count (or cap, if smaller), concatenated in rank
    order, then shuffled; party becomes the worker's rank as a string ("0", "1", ...), its id stays in attributes.

    Every step draws default_rng(seed).permutation, as HF `Dataset.shuffle(seed=seed)` does in the paper's code;
    rows left out are counted in `dropped` (by not being a kept worker, or by the balancing).
    """
    if cap is not None and cap < 1:
        raise ValueError(f"per-worker cap must be at least 1, got {cap}")
    by_worker: dict[str, list[PreferencePair]] = {w: [] for w in workers}
    for p in pairs:
        if p.party in by_worker:
            by_worker[p.party].append(p)
    smallest = min(len(rows) for rows in by_worker.values())
    if smallest == 0:
        missing = [w for w, rows in by_worker.items() if not rows]
        raise ValueError(f"{pairs.source}: no pairs for worker(s) {missing}")
    n = smallest if cap is None else min(smallest, cap)
    kept = []
    for rank, w in enumerate(workers):
        order = np.random.default_rng(seed).permutation(len(by_worker[w]))[:n]
        kept.extend(replace(by_worker[w][i], party=str(rank)) for i in order)
    shuffled = [kept[i] for i in np.random.default_rng(seed).permutation(len(kept))]
    kept_total = sum(len(rows) for rows in by_worker.values())
    dropped = {**pairs.dropped, f"worker not in the top {len(workers)}": len(pairs) - kept_total,
               f"over {n} per worker (balanced downsampling)": kept_total - len(shuffled)}
    return PreferenceSet(shuffled, dropped, pairs.source)


def load_tldr_users(
    root: str | Path | None,
    n_workers: int = 5,
    seed: int = 42,
    max_train_per_worker: int | None = None,
    max_valid_per_worker: int | None = None,
    drop_invalid: bool = False,
) -> tuple[PreferenceSet, PreferenceSet, list[str]]:
    """(train, validation, worker ids in rank order) for P-ShareLoRA (spec §5): the top n_workers by train count,
    both splits balanced per worker (5,373 / 1,238 in the paper) and shuffled with seed; pair.party is the
    worker's rank "0".."n_workers-1" (int(pair.party) indexes the returned ids), pair.attributes["worker"] its id.
    drop_invalid counts malformed rows instead of raising on the first.
    """
    train = tldr_split(root, "train", drop_invalid)
    valid = tldr_split(root, "validation", drop_invalid)
    workers = top_workers(train, n_workers)
    return (
        balanced_users(train, workers, seed, max_train_per_worker),
        balanced_users(valid, workers, seed, max_valid_per_worker),
        workers,
    )
