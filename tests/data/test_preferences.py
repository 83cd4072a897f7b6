import gzip
import pickle

import pytest

from collabalign.data import DataError, PreferencePair
from collabalign.data.formats import load_pairs
from collabalign.data.jsonl import read_jsonl
from collabalign.data.preferences import checked_pair, collect_pairs, same_reply
from tests.data.helpers import jsonl, write

GOOD = {"prompt": "Hi?", "chosen": "Hello, nice to meet you.", "rejected": "Go away."}


def drop_or_raise(path, drop_invalid: bool):
    """`collect_pairs` over a JSONL of prompt / chosen / rejected rows (what every pair loader builds on)."""
    def make(line, row):
        if not isinstance(row, dict) or any(f not in row for f in GOOD):
            raise DataError(path, line, next((f for f in GOOD if isinstance(row, dict) and f not in row), None),
                            "missing field" if isinstance(row, dict) else "not a JSON object")
        return [checked_pair(path, line, row["prompt"], row["chosen"], row["rejected"])]

    return collect_pairs(path, read_jsonl(path), make, drop_invalid)


def test_loads_rows_and_set_protocol(tmp_path):
    path = write(tmp_path / "p.jsonl", jsonl(GOOD, {**GOOD, "prompt": "Yo?"}) + "\n")  # trailing blank line
    pairs = load_pairs(path)
    assert len(pairs) == 2 and pairs.dropped == {} and pairs.source == str(path)
    assert pairs[0] == PreferencePair("Hi?", "Hello, nice to meet you.", "Go away.")
    assert [p.prompt for p in pairs] == ["Hi?", "Yo?"]


def test_gzip_detected_by_magic_bytes_not_extension(tmp_path):
    path = write(tmp_path / "looks_plain.jsonl", jsonl(GOOD), gz=True)
    assert load_pairs(path)[0].chosen == GOOD["chosen"]



def test_drop_invalid_counts_every_reason(tmp_path):
    lines = [
        jsonl(GOOD),
        "{broken\n",
        jsonl({**GOOD, "chosen": "  "}),
        jsonl({**GOOD, "rejected": GOOD["chosen"]}),
        jsonl({"prompt": "x", "chosen": "y"}),
        jsonl({**GOOD, "chosen": " "}),
        jsonl(GOOD),
    ]
    path = write(tmp_path / "mixed.jsonl", "".join(lines).encode() + b"\xff\xfe\n")
    pairs = drop_or_raise(path, drop_invalid=True)
    assert len(pairs) == 2
    assert pairs.dropped == {
        "invalid JSON": 1,
        "chosen: empty text": 2,
        "rejected: identical to chosen": 1,
        "rejected: missing field": 1,
        "not valid UTF-8": 1,
    }
    with pytest.raises(DataError) as info:
        drop_or_raise(path, drop_invalid=False)
    assert (info.value.line, info.value.message) == (2, "invalid JSON")


def test_all_rows_dropped_is_still_an_error(tmp_path):
    path = write(tmp_path / "bad.jsonl", "[1]\n[2]\n")
    with pytest.raises(DataError, match=r"no valid rows \(dropped: \{'not a JSON object': 2\}\)"):
        drop_or_raise(path, drop_invalid=True)


def test_truncated_gzip_is_a_data_error(tmp_path):
    path = write(tmp_path / "cut.jsonl.gz", gzip.compress(jsonl(GOOD, GOOD, GOOD).encode())[:-12])
    with pytest.raises(DataError, match="unreadable compressed data"):
        load_pairs(path)


def test_error_str_and_pickle():
    err = DataError("harmless.jsonl.gz", 17, "chosen", "empty text")
    assert str(err) == "harmless.jsonl.gz:17: field 'chosen': empty text"
    assert str(DataError("f.jsonl", None, None, "no rows")) == "f.jsonl: no rows"
    assert isinstance(err, ValueError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.line, copy.field, copy.message) == ("harmless.jsonl.gz", 17, "chosen", "empty text")


CHOSEN = GOOD["chosen"]
WHITESPACE_ONLY = {  # each differs from CHOSEN only in whitespace: no preference
    "leading-and-trailing": f"  {CHOSEN}\n",
    "internal-runs": CHOSEN.replace(" ", "   "),
    "tabs-and-newlines": CHOSEN.replace(", ", ",\t").replace(" to ", "\nto\r\n"),
}
REAL_DIFFERENCE = {  # each differs from CHOSEN in a real character (a joined word is a different word)
    "punctuation": CHOSEN.replace(".", "!"),
    "one-letter": CHOSEN.replace("meet", "meat"),
    "two-words-joined": CHOSEN.replace("to meet", "tomeet"),
}


@pytest.mark.parametrize("rejected", list(WHITESPACE_ONLY.values()), ids=list(WHITESPACE_ONLY))
def test_same_reply_ignores_whitespace_only(rejected):
    assert same_reply(CHOSEN, rejected) and same_reply(rejected, CHOSEN)


@pytest.mark.parametrize("rejected", list(REAL_DIFFERENCE.values()), ids=list(REAL_DIFFERENCE))
def test_same_reply_sees_a_real_character(rejected):
    assert not same_reply(CHOSEN, rejected)


@pytest.mark.parametrize("rejected", list(WHITESPACE_ONLY.values()), ids=list(WHITESPACE_ONLY))
def test_loaders_refuse_a_pair_differing_only_in_whitespace(tmp_path, rejected):
    path = write(tmp_path / "p.jsonl", jsonl(GOOD, {**GOOD, "rejected": rejected}))
    with pytest.raises(DataError) as info:
        load_pairs(path)
    assert (info.value.path, info.value.line, info.value.field, info.value.message) == (
        str(path), 2, "rejected", "identical to chosen")


@pytest.mark.parametrize("rejected", list(WHITESPACE_ONLY.values()), ids=list(WHITESPACE_ONLY))
def test_checked_pair_refuses_a_pair_differing_only_in_whitespace(rejected):
    with pytest.raises(DataError) as info:
        checked_pair("tldr.jsonl", 7, "Hi?", CHOSEN, rejected)
    assert (info.value.path, info.value.line, info.value.field, info.value.message) == (
        "tldr.jsonl", 7, "rejected", "identical to chosen")


@pytest.mark.parametrize("rejected", list(REAL_DIFFERENCE.values()), ids=list(REAL_DIFFERENCE))
def test_a_pair_differing_in_a_real_character_is_kept_as_written(tmp_path, rejected):
    path = write(tmp_path / "p.jsonl", jsonl({**GOOD, "rejected": rejected}))
    for pair in (drop_or_raise(path, False)[0], load_pairs(path)[0], checked_pair(path, 1, "Hi?", CHOSEN, rejected)):
        assert (pair.chosen, pair.rejected) == (CHOSEN, rejected)


def test_dropping_invalid_rows_counts_whitespace_only_pairs_as_identical(tmp_path):
    rows = [{**GOOD, "rejected": r} for r in (*WHITESPACE_ONLY.values(), *REAL_DIFFERENCE.values())]
    pairs = drop_or_raise(write(tmp_path / "p.jsonl", jsonl(*rows)), drop_invalid=True)
    assert [p.rejected for p in pairs] == list(REAL_DIFFERENCE.values())
    assert pairs.dropped == {"rejected: identical to chosen": len(WHITESPACE_ONLY)}
