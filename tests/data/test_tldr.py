"""Reddit TL;DR comparisons: the row schema, the paper's user formation (top workers, balanced, seeded), the hub."""

import re
from collections import Counter

import numpy as np
import pytest

from collabalign.data import DataError, load_tldr, load_tldr_users, tldr_texts
from collabalign.data import hub as hub_module
from collabalign.data.tldr import CNNDM, IDENTICAL, tldr_comparisons_from_hub, top_workers
from tests.data.helpers import jsonl, write


def row(i: int, worker: str, split: str = "train", choice: int = 0, cnndm: bool = False) -> dict:
    """One comparison in the Hugging Face schema; texts carry i so a pair can be traced back to its row."""
    info = {"id": f"t3_{split}{i}", "post": f"Body of post {i}.", "title": f"Title {i}", "subreddit": "tifu",
            "site": None, "article": None}
    if cnndm:
        info.update(post=None, subreddit=None, site="dailymail", article=f"News article {i}.")
    summaries = [{"text": f" first summary {i}", "policy": "sup2", "note": None},
                 {"text": f" second summary {i}", "policy": "ref", "note": None}]
    return {"info": info, "summaries": summaries, "choice": choice, "worker": worker, "batch": "batch5",
            "split": split, "extra": {"confidence": 7}}


# Train counts (Reddit rows): wa 9, wb 7, wc 6, wd 5, we 4, wf 3 (+2 CNN/DM rows: 5 if they counted), wg 2.
# wg comes first in the file, so file order is not rank order. Validation: wa 4, wb 3, wc 5, wd 2, we 3, wf 2,
# plus one CNN/DM row by wa.
TRAIN_COUNTS = {"wg": 2, "we": 4, "wa": 9, "wf": 3, "wb": 7, "wc": 6, "wd": 5}
VALID_COUNTS = {"wa": 4, "wb": 3, "wc": 5, "wd": 2, "we": 3, "wf": 2}
RANKED = ["wa", "wb", "wc", "wd", "we"]


def split_rows(counts: dict[str, int], split: str, cnndm: dict[str, int]) -> list[dict]:
    """Rows for every worker, interleaved round-robin (a realistic mix), CNN/DM rows last."""
    rows, i, left = [], 0, dict(counts)
    while any(left.values()):
        for w in counts:
            if left[w]:
                rows.append(row(i, w, split, choice=i % 2))
                left[w], i = left[w] - 1, i + 1
    news = [w for w, n in cnndm.items() for _ in range(n)]
    return rows + [row(i + k, w, split, cnndm=True) for k, w in enumerate(news)]


TRAIN = split_rows(TRAIN_COUNTS, "train", {"wf": 2})
VALID = split_rows(VALID_COUNTS, "valid", {"wa": 1})


@pytest.fixture
def root(tmp_path):
    """A folder with train.jsonl.gz and validation.jsonl."""
    write(tmp_path / "train.jsonl.gz", jsonl(*TRAIN), gz=True)
    write(tmp_path / "validation.jsonl", jsonl(*VALID))
    return tmp_path


def test_top_workers_by_train_count_reindexed_in_rank_order(root):
    train, valid, workers = load_tldr_users(root)
    assert workers == RANKED  # wf's CNN/DM rows do not count: it would tie wd with them
    for data in (train, valid):
        assert {p.party for p in data} == {"0", "1", "2", "3", "4"}
        assert all(workers[int(p.party)] == p.attributes["worker"] for p in data)


def test_both_splits_balanced_to_their_smallest_worker(root):
    train, valid, _ = load_tldr_users(root)
    assert Counter(p.party for p in train) == {str(r): 4 for r in range(5)}  # we has 4 in train
    assert Counter(p.party for p in valid) == {str(r): 2 for r in range(5)}  # wd has 2 in validation
    train_c, valid_c, _ = load_tldr_users(root, max_train_per_worker=3, max_valid_per_worker=5)
    assert Counter(p.party for p in train_c) == {str(r): 3 for r in range(5)}
    assert Counter(p.party for p in valid_c) == {str(r): 2 for r in range(5)}  # a cap never raises the count


def test_every_row_is_kept_or_counted_by_reason(root):
    train, valid, _ = load_tldr_users(root)
    assert train.dropped == {CNNDM: 2, "worker not in the top 5": 3 + 2, "over 4 per worker (balanced downsampling)":
                             9 + 7 + 6 + 5 + 4 - 20}
    assert valid.dropped == {CNNDM: 1, "worker not in the top 5": 2, "over 2 per worker (balanced downsampling)":
                             4 + 3 + 5 + 2 + 3 - 10}
    assert len(train) + sum(train.dropped.values()) == len(TRAIN)
    assert len(valid) + sum(valid.dropped.values()) == len(VALID)


def test_selection_and_order_are_hf_shuffle_seed_42(root):
    """Per worker: its rows in file order, shuffled by default_rng(42).permutation, first n (HF
    `Dataset.shuffle(seed=42).select(range(n))`); then the rank-order concatenation is shuffled the same way."""
    train, _, workers = load_tldr_users(root)
    expected = []
    for w in workers:
        ids = [r["info"]["id"] for r in TRAIN if r["worker"] == w and r["info"]["post"] is not None]
        expected += [ids[i] for i in np.random.default_rng(42).permutation(len(ids))[:4]]
    expected = [expected[i] for i in np.random.default_rng(42).permutation(len(expected))]
    assert [p.attributes["post_id"] for p in train] == expected


def test_deterministic_for_a_seed_and_caps_are_nested(root):
    first, second = load_tldr_users(root), load_tldr_users(root)
    assert first[0].pairs == second[0].pairs and first[1].pairs == second[1].pairs
    other = load_tldr_users(root, seed=7)[0]
    assert [p.attributes["post_id"] for p in other] != [p.attributes["post_id"] for p in first[0]]
    capped = load_tldr_users(root, max_train_per_worker=2)[0]
    assert {p.attributes["post_id"] for p in capped} < {p.attributes["post_id"] for p in first[0]}


def test_text_template_and_full_texts(root):
    train, _, _ = load_tldr_users(root)
    for p in train:
        i = int(p.attributes["post_id"].removeprefix("t3_train"))
        first, second = f" first summary {i}", f" second summary {i}"
        assert p.prompt == f"SUBREDDIT: r/tifu\nTITLE: Title {i}\nPOST: Body of post {i}.\nTL;DR: "
        assert (p.chosen, p.rejected) == ((first, second) if i % 2 == 0 else (second, first))  # choice = i % 2
        assert tldr_texts(p) == (p.prompt + p.chosen, p.prompt + p.rejected)
        assert (p.attributes["chosen_policy"], p.attributes["confidence"]) == (("sup2", "ref")[i % 2], 7)


def bad(change) -> dict:
    """A good row changed in place by `change`."""
    r = row(1, "wa")
    change(r)
    return r


MALFORMED = {
    "missing_choice": (lambda r: r.pop("choice"), "choice", "missing field"),
    "choice_2": (lambda r: r.update(choice=2), "choice", "expected 0 or 1, got 2"),
    "choice_string": (lambda r: r.update(choice="1"), "choice", "expected 0 or 1, got '1'"),
    "choice_bool": (lambda r: r.update(choice=True), "choice", "expected 0 or 1, got True"),
    "missing_summary_text": (lambda r: r["summaries"][1].pop("text"), "summaries[1].text", "missing field"),
    "blank_summary_text": (lambda r: r["summaries"][0].update(text="  "), "summaries[0].text", "empty text"),
    "summary_not_object": (lambda r: r["summaries"].__setitem__(0, "text"), "summaries[0]", "not a JSON object"),
    "three_summaries": (lambda r: r["summaries"].append(r["summaries"][0]), "summaries", "expected 2 summaries"),
    "missing_summaries": (lambda r: r.pop("summaries"), "summaries", "missing field"),
    "info_not_object": (lambda r: r.update(info="post"), "info", "not a JSON object"),
    "null_post_no_article": (lambda r: r["info"].update(post=None), "info.post", "not a string"),
    "missing_title": (lambda r: r["info"].pop("title"), "info.title", "missing field"),
    "missing_worker": (lambda r: r.pop("worker"), "worker", "missing field"),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_rows_name_file_line_field(tmp_path, case):
    change, field, fragment = case
    path = write(tmp_path / "train.jsonl", jsonl(row(0, "wa"), bad(change)))
    with pytest.raises(DataError) as info:
        load_tldr(path)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, field)
    assert fragment in info.value.message and str(info.value).startswith(f"{path}:2: field {field!r}")


def test_drop_invalid_counts_malformed_rows_and_ties_are_dropped(tmp_path):
    tie = bad(lambda r: r["summaries"][1].update(text=r["summaries"][0]["text"]))
    path = write(tmp_path / "train.jsonl", jsonl(row(0, "wa"), bad(lambda r: r.update(choice=2)), tie) + "{\n")
    data = load_tldr(path, drop_invalid=True)
    assert len(data) == 1
    assert data.dropped == {"choice: expected 0 or 1, got 2": 1, IDENTICAL: 1, "invalid JSON": 1}
    only_cnndm = write(tmp_path / "validation.jsonl", jsonl(row(0, "wa", cnndm=True)))
    with pytest.raises(DataError, match="no valid rows .dropped: ..no Reddit post"):
        load_tldr(only_cnndm)


def test_formation_errors(root):
    with pytest.raises(ValueError, match="only 7 workers, fewer than the 8"):
        load_tldr_users(root, n_workers=8)
    with pytest.raises(ValueError, match="cap must be at least 1"):
        load_tldr_users(root, max_valid_per_worker=0)
    write(root / "validation.jsonl", jsonl(*[r for r in VALID if r["worker"] != "wc"]))  # a top-5 worker missing
    with pytest.raises(ValueError, match=r"no pairs for worker\(s\) \['wc'\]"):
        load_tldr_users(root)


def test_equal_train_counts_keep_first_appearance_order(tmp_path):
    path = write(tmp_path / "train.jsonl", jsonl(row(0, "late"), row(1, "early"), row(2, "early"), row(3, "late")))
    assert top_workers(load_tldr(path), 2) == ["late", "early"]


@pytest.fixture
def hub(monkeypatch):
    """Replace the hub with copies of TRAIN / VALID (under "rows", to change) and record each call's
    (name, config, split) under "calls"."""
    state = {"calls": [], "rows": {"train": list(TRAIN), "validation": list(VALID)}}

    def fake(name, config, split):
        state["calls"].append((name, config, split))
        return state["rows"][split]

    monkeypatch.setattr(hub_module, "load_hub_dataset", fake)
    return state


def test_hub_when_no_local_files(root, hub):
    local = load_tldr_users(root)
    assert hub["calls"] == []
    for where in (None, root / "absent"):
        train, valid, workers = load_tldr_users(where)
        assert (train.pairs, valid.pairs, workers) == (local[0].pairs, local[1].pairs, local[2])
        assert train.source == "hub:openai/summarize_from_feedback/comparisons[train]"
        assert train.dropped == local[0].dropped
    assert hub["calls"] == [("openai/summarize_from_feedback", "comparisons", s) for s in ("train", "validation")] * 2


def test_hub_errors_name_the_row(hub):
    hub["rows"]["validation"].append(bad(lambda r: r.pop("choice")))
    line = len(hub["rows"]["validation"])
    with pytest.raises(DataError, match=re.escape(f"comparisons[validation]:{line}: field 'choice'")):
        load_tldr_users(None)
    assert load_tldr_users(None, drop_invalid=True)[1].dropped["choice: missing field"] == 1
    assert tldr_comparisons_from_hub("validation").dropped["choice: missing field"] == 1


def test_offline_says_where_the_files_go(tmp_path, monkeypatch):
    def missing(name, config, split):
        raise ImportError("loading from the Hugging Face hub needs the optional `datasets` package")

    monkeypatch.setattr(hub_module, "load_hub_dataset", missing)
    where = re.escape(f"TL;DR comparisons: no train.jsonl(.gz) in {tmp_path}, so the train split is loaded")
    with pytest.raises(ImportError, match=where + ".*datasets"):
        load_tldr_users(tmp_path)
