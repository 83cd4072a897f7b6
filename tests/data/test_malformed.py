"""Every loader names the file, line and field of a malformed input."""


import numpy as np
import pytest

from collabalign.data import (
    DataError,
    attribute_labels,
    load_commonsense,
    load_glue,
    load_hh_rlhf,
    load_tldr,
    tiny_preferences,
)
from collabalign.data.amazon_reviews import read_reviews
from collabalign.data.formats import load_pairs
from collabalign.data.pku_saferlhf import load_pku_saferlhf
from tests.data.helpers import MNLI_HEAD, jsonl, mnli_row, write

OK = {"prompt": "Hi?", "chosen": "Hello.", "rejected": "Bye."}
HH_OK = {"chosen": "\n\nHuman: Hi?\n\nAssistant: Hello.", "rejected": "\n\nHuman: Hi?\n\nAssistant: Bye."}


# (loader, file name, content, expected line, expected field, message fragment)
CASES = {
    "invalid_json": (load_pairs, "a.jsonl", jsonl(OK) + '{"prompt": \n', 2, None, "invalid JSON"),
    "not_object": (load_pairs, "a.jsonl", "[1, 2]\n", 1, None, "not a JSON object"),
    "bad_utf8": (load_pairs, "a.jsonl", jsonl(OK, OK).encode() + b'{"prompt": "\xc3\x28"}\n', 3, None, "UTF-8"),
    "missing_field": (load_pairs, "a.jsonl", jsonl(OK, {"prompt": "p", "rejected": "r"}), 2, "chosen", "missing"),
    "non_string": (load_pairs, "a.jsonl", jsonl({**OK, "rejected": 3}), 1, "rejected", "not a string"),
    "blank_text": (load_pairs, "a.jsonl", jsonl(OK, OK, {**OK, "prompt": " \n\t"}), 3, "prompt", "empty text"),
    "chosen_eq_rejected": (load_pairs, "a.jsonl", jsonl({**OK, "rejected": "Hello."}), 1, "rejected", "identical"),
    "empty_file": (load_pairs, "a.jsonl", "", None, None, "no rows"),
    "hh_no_assistant": (
        load_hh_rlhf, "h.jsonl", jsonl(HH_OK, {**HH_OK, "chosen": "\n\nHuman: Hi?"}), 2, "chosen", "Assistant"
    ),
    "hh_prompt_differs": (
        load_hh_rlhf, "h.jsonl", jsonl({**HH_OK, "rejected": "\n\nHuman: Yo?\n\nAssistant: Bye."}), 1, "rejected",
        "prompt differs from chosen's",
    ),
    "hh_empty_reply": (
        load_hh_rlhf, "h.jsonl", jsonl({**HH_OK, "chosen": "\n\nHuman: Hi?\n\nAssistant: "}), 1, "chosen", "empty"
    ),
    "hh_missing_rejected": (load_hh_rlhf, "h.jsonl", jsonl({"chosen": HH_OK["chosen"]}), 1, "rejected", "missing"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_preference_loaders_name_file_line_field(tmp_path, case):
    loader, name, content, line, field, fragment = case
    path = write(tmp_path / name, content)
    with pytest.raises(DataError) as info:
        loader(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert fragment in err.message
    assert str(err).startswith(str(path) + (f":{line}: " if line else ": "))


SST2 = "sentence\tlabel\na fine film \t1\n"
RTE = "index\tsentence1\tsentence2\tlabel\n0\tA cat sat.\tAn animal sat.\tentailment\n"
STSB = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
MRPC = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
QNLI = "index\tquestion\tsentence\tlabel\n"
QQP = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
MNLI_DEV = MNLI_HEAD + "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"

GLUE_CASES = {
    "rte_unknown_label": ("RTE", RTE + "1\tA dog ran.\tA dog moved.\tmaybe\n", 3, "label", "'maybe'"),
    "sst2_column_count": ("SST-2", SST2 + "too\tmany\tcolumns\n", 3, None, "expected 2 tab-separated columns, got 3"),
    "stsb_score_not_numeric": ("STS-B", STSB + "0\tg\tf\t2012\t1\tn\tn\tA.\tB.\tfive\n", 2, "score", "'five'"),
    "stsb_score_out_of_range": ("STS-B", STSB + "0\tg\tf\t2012\t1\tn\tn\tA.\tB.\t7.5\n", 2, "score", "'7.5'"),
    "mrpc_wrong_header": ("MRPC", "Quality\tid1\tid2\ts1\ts2\n1\t1\t2\tA.\tB.\n", 1, None, "header"),
    "mrpc_empty_text": ("MRPC", MRPC + "1\t1\t2\tA.\t \n", 2, "#2 String", "empty text"),
    "cola_binary_label": ("CoLA", "gj04\t1\t\tGood.\ngj04\t2\t*\tBad.\n", 2, "label", "'2'"),
    "cola_bad_utf8": ("CoLA", b"gj04\t1\t\tGood.\ngj04\t0\t*\tBad \xff.\n", 2, None, "UTF-8"),
    "sst2_header_only": ("SST-2", "sentence\tlabel\n", None, None, "no rows"),
    "qnli_unknown_label": ("QNLI", QNLI + "0\tWho?\tHe did.\tentailed\n", 2, "label", "'entailed'"),
    # original QQP rows broken by a newline inside a question: the first part lacks question2 and is_duplicate
    "qqp_row_split_by_newline": ("QQP", QQP + "1\t1\t2\tHow do\nI cook?\tHow to cook?\t1\n", 2, "question2",
                                 "expected 6 tab-separated columns, got 4"),
    "qqp_empty_question": ("QQP", QQP + "1\t1\t2\tHow?\t\t0\n", 2, "question2", "empty text"),
    "qqp_bad_duplicate_flag": ("QQP", QQP + "1\t1\t2\tHow?\tWhy?\tyes\n", 2, "is_duplicate", "'yes'"),
    "mnli_no_gold_label": ("MNLI", MNLI_DEV + mnli_row(0, "A.", "B.", "neutral", "neutral", "entailment",
                                                       "contradiction", "entailment", "-"), 2, "gold_label", "'-'"),
    "mnli_header_without_gold_label": ("MNLI", MNLI_HEAD + "label1\n", 1, None, "lacks column(s) ['gold_label']"),
}


@pytest.mark.parametrize("case", GLUE_CASES.values(), ids=GLUE_CASES.keys())
def test_glue_names_file_line_field(tmp_path, case):
    task, content, line, field, fragment = case
    (tmp_path / task).mkdir()
    path = write(tmp_path / task / ("dev_matched.tsv" if task == "MNLI" else "dev.tsv"), content)
    with pytest.raises(DataError) as info:
        load_glue(task, "dev", tmp_path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), line, field)
    assert fragment in str(err)


LOADERS = {  # every loader that reads a file, as a call on one path
    "pairs": load_pairs,
    "hh_rlhf": load_hh_rlhf,
    "pku_saferlhf": load_pku_saferlhf,
    "tldr": load_tldr,
    "commonsense": load_commonsense,
    "amazon_reviews": lambda path: read_reviews(path, "books", 1),
}


@pytest.mark.parametrize("loader", LOADERS.values(), ids=LOADERS.keys())
def test_a_missing_file_or_a_folder_is_a_data_error_naming_it(tmp_path, loader):
    with pytest.raises(DataError, match=f"^{tmp_path / 'absent.jsonl'}: no such file$"):
        loader(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match=f"^{tmp_path}: cannot read"):
        loader(tmp_path)


def test_a_missing_glue_file_is_a_data_error_naming_it(tmp_path):
    (tmp_path / "RTE").mkdir()
    with pytest.raises(DataError, match=f"^{tmp_path / 'RTE' / 'dev.tsv'}: no such file$"):
        load_glue("RTE", "dev", tmp_path)
    with pytest.raises(DataError, match="no such file"):
        load_glue("SST-2", "train", tmp_path)


def test_a_glue_line_csv_cannot_split_is_a_data_error_naming_it(tmp_path):
    (tmp_path / "SST-2").mkdir()
    write(tmp_path / "SST-2" / "dev.tsv", SST2 + "x" * 200_000 + "\t1\n")
    with pytest.raises(DataError, match=r"dev\.tsv:3: cannot split into columns \(field larger than field limit"):
        load_glue("SST-2", "dev", tmp_path)


def test_corrupt_compressed_or_non_utf8_files_are_data_errors(tmp_path):
    bad_gzip = write(tmp_path / "a.review.gz", b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match="unreadable compressed data"):
        read_reviews(bad_gzip, "books", 1)
    with pytest.raises(DataError, match="not valid UTF-8"):
        read_reviews(write(tmp_path / "b.review", b"<review>\xff</review>"), "books", 1)
    with pytest.raises(DataError, match=r"test\.json: invalid JSON \(nested too deeply\)"):
        load_commonsense(write(tmp_path / "test.json", "[" * 100_000 + "]" * 100_000))
    with pytest.raises(DataError, match=r"a\.jsonl:1: invalid JSON"):
        load_pairs(write(tmp_path / "a.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"))


def test_an_unknown_split_attribute_names_it_and_the_known_ones():
    pairs = tiny_preferences(5, np.random.default_rng(0))
    assert attribute_labels(pairs, "topic") == [p.attributes["topic"] for p in pairs]
    with pytest.raises(DataError, match=r"field 'topics': unknown split attribute \(pair 1 lacks it\); "
                                        r"known: \['topic'\]"):
        attribute_labels(pairs, "topics")
