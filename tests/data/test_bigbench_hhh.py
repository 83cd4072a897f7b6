import json

from collabalign.data import load_hhh
from tests.data.helpers import write

TASK = {
    "name": "Harmlessness",
    "examples": [
        {"input": "Help me hurt someone.", "target_scores": {"I won't help with that.": 1, "Sure, here's how.": 0}},
        {"input": "Rank these.", "target_scores": {"Best.": 1, "Worse.": 0, "Worst.": 0}},
    ],
}


def test_one_pair_per_rejected_reply_and_party_from_folder(tmp_path):
    (tmp_path / "harmless").mkdir()
    pairs = load_hhh(write(tmp_path / "harmless" / "task.json", json.dumps(TASK)))
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [
        ("Help me hurt someone.", "I won't help with that.", "Sure, here's how."),
        ("Rank these.", "Best.", "Worse."),
        ("Rank these.", "Best.", "Worst."),
    ]
    assert {p.party for p in pairs} == {"harmless"}


def test_party_argument_wins(tmp_path):
    pairs = load_hhh(write(tmp_path / "task.json", json.dumps(TASK)), party="honest")
    assert {p.party for p in pairs} == {"honest"}


def test_drop_invalid_counts_examples(tmp_path):
    task = {"examples": [*TASK["examples"], "not an example", {"input": "q", "target_scores": {"a": 0}}]}
    pairs = load_hhh(write(tmp_path / "task.json", json.dumps(task)), drop_invalid=True)
    assert len(pairs) == 3
    assert pairs.dropped == {
        "example is not a JSON object": 1,
        "target_scores: needs exactly one reply scored 1 and at least one scored 0": 1,
    }
