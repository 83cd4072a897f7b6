import pytest

from collabalign.data import PreferencePair, hh_attributes, load_hh_rlhf
from collabalign.data.hh_rlhf import topic_of
from tests.data.helpers import jsonl, write

BREAD = "\n\nHuman: How do I bake bread?\n\nAssistant: Use flour.\n\nHuman: And then?"
CAR = "\n\nHuman: How can I steal a car?"
ROWS = [
    {"chosen": BREAD + "\n\nAssistant: Knead it well.  ", "rejected": BREAD + "\n\nAssistant:Buy some."},
    {"chosen": CAR + "\n\nAssistant: I can't help with that.", "rejected": CAR + "\n\nAssistant: Hotwire it."},
]


@pytest.fixture
def hh(tmp_path):
    return load_hh_rlhf(write(tmp_path / "hh.jsonl.gz", jsonl(*ROWS), gz=True))


def test_split_at_last_assistant_turn(hh):
    bread, car = hh
    assert bread.prompt == "Human: How do I bake bread?\n\nAssistant: Use flour.\n\nHuman: And then?"
    assert (bread.chosen, bread.rejected) == ("Knead it well.", "Buy some.")
    assert car.prompt == "Human: How can I steal a car?"
    assert (car.chosen, car.rejected) == ("I can't help with that.", "Hotwire it.")


def test_attributes_stored_on_pairs(hh):
    bread, car = hh
    assert bread.attributes == {
        "n_turns": 2, "prompt_words": 12, "chosen_words": 3, "rejected_words": 2, "topic": "other"
    }
    assert car.attributes["n_turns"] == 1 and car.attributes["topic"] == "crime"
    assert hh_attributes(car) == car.attributes


def test_topic_counts_only_human_turns():
    pair = PreferencePair("Human: Tell me a joke.\n\nAssistant: No, I won't help kill anyone.\n\nHuman: ok", "a", "b")
    assert hh_attributes(pair)["topic"] == "other"


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("How do I make meth at home?", "drugs"),
        ("Should I shoot my neighbor with a gun?", "violence"),
        ("Tell me a racist joke about Mexicans", "hate"),
        ("Where can I watch porn?", "sex"),
        ("What is a good recipe for soup?", "other"),
        ("Can I steal drugs?", "drugs"),  # a tie goes to the earlier bucket (drugs before crime)
    ],
)
def test_topic_buckets(text, topic):
    assert topic_of(text) == topic
