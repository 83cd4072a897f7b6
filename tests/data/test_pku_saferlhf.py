"""PKU-SafeRLHF rows and FIRM's prompt lists: typed rows, errors naming file, line and field, real-file counts."""

import pytest

from collabalign.data import DataError
from collabalign.data.hh_rlhf import HH_FILE
from collabalign.data.pku_saferlhf import PKU_FILE, hh_prompts, load_pku_saferlhf, pku_prompts
from tests.data.helpers import SHARED, jsonl, write, write_hh


def row(i: int = 0, **changes) -> dict:
    base = {"prompt": f"How do I do thing {i % 2}?", "response_0": f"Like this {i}.", "response_1": "I won't.",
            "better_response_id": i % 2, "safer_response_id": 1, "is_response_0_safe": True,
            "is_response_1_safe": i % 3 == 0, "response_0_severity_level": 0}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not ...}


def test_rows_are_typed_and_prompts_are_distinct_in_order(tmp_path):
    path = write(tmp_path / "pku.jsonl.gz", jsonl(*(row(i) for i in range(4))), gz=True)
    rows = load_pku_saferlhf(path)
    assert len(rows) == 4 and rows[1].better_response_id == 1 and rows[1].safe == (True, False)
    assert rows[0].responses == ("Like this 0.", "I won't.")
    assert pku_prompts(rows) == ["How do I do thing 0?", "How do I do thing 1?"]


@pytest.mark.parametrize(("changes", "field", "message"), [
    ({"response_1": ...}, "response_1", "missing field"),
    ({"prompt": "  "}, "prompt", "empty text"),
    ({"better_response_id": 2}, "better_response_id", "must be 0 or 1, got 2"),
    ({"safer_response_id": True}, "safer_response_id", "must be 0 or 1"),
    ({"is_response_0_safe": "yes"}, "is_response_0_safe", "must be true or false"),
    ({"is_response_1_safe": ...}, "is_response_1_safe", "missing field"),
])
def test_a_bad_row_names_file_line_and_field(tmp_path, changes, field, message):
    path = write(tmp_path / "pku.jsonl", jsonl(row(0), row(1, **changes)))
    with pytest.raises(DataError, match=rf"pku.jsonl:2: field '{field}': {message}"):
        load_pku_saferlhf(path)


def test_bad_json_and_empty_files_are_named(tmp_path):
    with pytest.raises(DataError, match=r"bad.jsonl:2: invalid JSON"):
        load_pku_saferlhf(write(tmp_path / "bad.jsonl", jsonl(row(0)) + "{oops\n"))
    with pytest.raises(DataError, match=r"empty.jsonl: no rows"):
        load_pku_saferlhf(write(tmp_path / "empty.jsonl", "\n"))


def test_hh_prompts_last_turn_or_dialogue(tmp_path):
    path = write_hh(tmp_path)
    assert hh_prompts(path)[:2] == ["Question 0?", "Question 1?"] and len(hh_prompts(path)) == 24
    assert hh_prompts(path, last_turn=False)[0] == "Human: Question 0?"


@pytest.mark.real
@pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)")
def test_real_pku_rows_and_hh_prompts():
    rows = load_pku_saferlhf(SHARED / PKU_FILE)
    assert len(rows) == 394
    assert sum(r.better_response_id != r.safer_response_id for r in rows) == 91  # as the shared README says
    safe_share = sum(s for r in rows for s in r.safe) / 788
    assert 0.5 < safe_share < 0.56
    prompts = hh_prompts(SHARED / HH_FILE)
    assert len(prompts) > 2000 and all(p and "Assistant:" not in p for p in prompts)
