"""GLUE from the hub with a fake `load_hub_dataset` (no network), and load_glue_any's choice of local files or hub."""

import re

import numpy as np
import pytest

from collabalign.data import glue_from_hub, load_glue_any
from collabalign.data import hub as hub_module
from tests.data.helpers import write

# hub config -> its columns, as nyu-mll/glue names them, for two rows
HUB_ROWS = {
    "qnli": {"question": ["Who sat?", "Why?"], "sentence": ["The cat sat.", "It rained."], "label": [0, 1]},
    "qqp": {"question1": ["How to cook?", "Why blue?"], "question2": ["How do I cook?", "2+2?"], "label": [1, 0]},
    "mnli": {"premise": ["A man sleeps.", "A dog barks."], "hypothesis": ["He rests.", "A cat meows."],
             "label": [1, 2]},
}


@pytest.fixture
def calls(monkeypatch):
    """Replace the hub with HUB_ROWS; returns the (name, config, split) of every call."""
    seen = []

    def fake(name, config, split):
        seen.append((name, config, split))
        return HUB_ROWS[config]

    monkeypatch.setattr(hub_module, "load_hub_dataset", fake)
    return seen


@pytest.mark.parametrize(("task", "config", "dev_split", "num_labels"), [
    ("QNLI", "qnli", "validation", 2), ("QQP", "qqp", "validation", 2), ("MNLI", "mnli", "validation_matched", 3),
])
def test_hub_columns_and_splits(calls, task, config, dev_split, num_labels):
    a, b, labels = HUB_ROWS[config].values()
    for split, hub_split in (("dev", dev_split), ("train", "train")):
        data = glue_from_hub(task, split)
        assert calls[-1] == ("nyu-mll/glue", config, hub_split)
        assert (data.text_a, data.text_b, data.num_labels, data.metric, data.task) == (
            a, b, num_labels, "accuracy", task
        )
        assert data.labels.dtype == np.int64 and data.labels.tolist() == labels
    with pytest.raises(ValueError, match="unknown GLUE split 'test'"):
        glue_from_hub(task, "test")


def test_load_glue_any_prefers_local_files(tmp_path, calls):
    (tmp_path / "QNLI").mkdir()
    write(tmp_path / "QNLI" / "dev.tsv", "index\tquestion\tsentence\tlabel\n0\tLocal?\tYes.\tentailment\n")
    assert load_glue_any("QNLI", "dev", tmp_path).text_a == ["Local?"] and calls == []
    assert load_glue_any("MNLI", "dev", tmp_path).text_a == HUB_ROWS["mnli"]["premise"]
    assert load_glue_any("QQP", "train", None).text_b == HUB_ROWS["qqp"]["question2"]
    assert calls == [("nyu-mll/glue", "mnli", "validation_matched"), ("nyu-mll/glue", "qqp", "train")]


def test_load_glue_any_offline_says_where_the_files_go(tmp_path, monkeypatch):
    def missing(name, config, split):
        raise ImportError("loading from the Hugging Face hub needs the optional `datasets` package")

    monkeypatch.setattr(hub_module, "load_hub_dataset", missing)
    where = re.escape(f"GLUE QQP: no folder {tmp_path / 'QQP'} holding its tsv files")
    with pytest.raises(ImportError, match=where + ".*datasets"):
        load_glue_any("QQP", "train", tmp_path)
