"""Amazon multi-domain reviews: parsing, errors naming file/record/field, opening groups and same-prompt pairs
(higher rating chosen, each review once, seeded), 𝒟^T examples, pair splits, and the real shared files' counts."""

from pathlib import Path

import numpy as np
import pytest

from collabalign.data import DataError
from collabalign.data.amazon_reviews import (
    AMAZON_DIR,
    DOMAINS,
    domain_data,
    load_domain,
    load_task,
    preference_pairs,
    split_pairs,
)
from tests.data.helpers import SHARED, write

FILLER = "and then some more words follow here so that the continuation is long enough to cut a window"


def record(rating: object = "5.0", text: object = "Fine.", title: str = "A title", skip: tuple[str, ...] = ()) -> str:
    """One pseudo-XML review record as the dataset writes it (fields on their own lines); `skip` omits fields."""
    fields = {"unique_id": "B000:x:y", "asin": "B000", "product_name": "Thing: Kitchen", "product_type": "kitchen",
              "helpful": "1 of 2", "rating": rating, "title": title, "date": "May 1, 2006", "reviewer": "Someone",
              "reviewer_location": "Somewhere", "review_text": text}
    body = "".join(f"<{k}>\n{v}\n</{k}>\n" for k, v in fields.items() if k not in skip)
    return f"<review>\n{body}</review>\n"


def write_domain(root: Path, domain: str, positive: list[str], negative: list[str]) -> Path:
    """Write a domain's positive and negative .review.gz files under root/domain and return root."""
    (root / domain).mkdir(parents=True, exist_ok=True)
    for name, records in (("positive", positive), ("negative", negative)):
        write(root / domain / f"{name}.review.gz", "<data>\n" + "".join(records) + "</data>\n", gz=True)
    return root


def review(opening: str, i: int, rating: str) -> str:
    """A usable review: the opening, then `item{i}` and the filler (20 words after the opening, then one more)."""
    return record(rating, f"{opening} item{i} {FILLER} {i} extra")


POSITIVE = [review("This blender", 0, "5.0"), review("this blender", 1, "4.0"), review("This blender", 2, "5.0"),
            review("I bought", 3, "5.0"), review("I bought", 4, "4.0"), review("Great product", 5, "5.0"),
            record("5.0", "Good. Works well.")]  # 4 words: too short for opening 2 + 5
NEGATIVE = [review("This blender", 6, "1.0"), review("THIS BLENDER", 7, "2.0"), review("I bought", 8, "1.0"),
            review("I bought", 9, "2.0"), review("I bought", 10, "1.0"), review("Terrible thing", 11, "1.0")]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_domain(tmp_path, "kitchen", POSITIVE, NEGATIVE)


def test_records_are_parsed_in_file_order(tmp_path):
    text = "Line one &quot;quoted&quot; &amp; more.\n\n  Line   two."
    root = write_domain(tmp_path, "books", [record("4.0", text, title="T &amp; U"), record("5.0", "Second.")],
                        [record("1.0", "Bad.")])
    reviews = load_domain(root, "books")
    assert [(r.index, r.label, r.rating) for r in reviews] == [(1, 1, 4.0), (2, 1, 5.0), (1, 0, 1.0)]
    assert reviews[0].text == 'Line one "quoted" & more. Line two.' and reviews[0].title == "T & U"
    assert reviews[0].domain == "books"


def test_unknown_domain_and_missing_file(tmp_path, root):
    with pytest.raises(ValueError, match="unknown Amazon domain 'toys'; known: books, dvd, electronics, kitchen"):
        load_domain(root, "toys")
    (root / "kitchen" / "negative.review.gz").unlink()
    with pytest.raises(DataError, match=r"kitchen/negative\.review\.gz: no such file"):
        load_domain(root, "kitchen")


@pytest.mark.parametrize(("bad", "field", "message"), [
    (record(skip=("rating",)), "rating", "missing field"),
    (record(rating="five"), "rating", "not a number: 'five'"),
    (record(rating="6.0"), "rating", r"must be one of 1\.\.5, got '6\.0'"),
    (record(rating="2.5"), "rating", "must be one of 1"),
    (record(skip=("review_text",)), "review_text", "missing field"),
    (record(text="   "), "review_text", "empty text"),
])
def test_a_bad_record_names_file_record_and_field(tmp_path, bad, field, message):
    root = write_domain(tmp_path, "dvd", [record()], [record("1.0"), record("2.0"), bad])
    with pytest.raises(DataError, match=rf"negative\.review\.gz:3: field '{field}': {message}"):
        load_domain(root, "dvd")


def test_unterminated_and_empty_files_are_named(tmp_path):
    root = write_domain(tmp_path, "dvd", [record(), record()[:-10]], [record("1.0")])
    with pytest.raises(DataError, match=r"positive\.review\.gz:2: no closing </review>"):
        load_domain(root, "dvd")
    root = write_domain(tmp_path, "dvd", [record()], [])
    with pytest.raises(DataError, match=r"negative\.review\.gz: no <review> records"):
        load_domain(root, "dvd")


def test_openings_group_case_insensitively_and_short_reviews_are_counted(root):
    data = domain_data(load_domain(root, "kitchen"), opening_words=2, response_words=20)
    assert data.counts == {"reviews": 13, "usable": 12, "skipped_short": 1, "groups": 4, "pair_groups": 2,
                           "pairs": 4, "examples": 12}
    prompts = {e.review_index: e.prompt for e in data.examples}
    blender = 'Continue this kitchen product review, which begins: "This blender"'  # the most common casing
    assert prompts[0] == prompts[1] == prompts[7] == prompts[8] == blender
    first = data.examples[0]
    assert first.response == " ".join(f"item0 {FILLER} 0 extra words".split()[:20]) and first.domain == "kitchen"
    assert all(not hasattr(e, "rating") and not hasattr(e, "label") for e in data.examples)


def test_pairs_share_a_prompt_prefer_the_higher_rating_and_use_each_review_once(root):
    reviews = load_domain(root, "kitchen")
    examples = {e.review_index: e for e in domain_data(reviews).examples}
    pairs = preference_pairs(reviews, 2, 20, np.random.default_rng(0))
    ratings = [r.rating for r in reviews]
    assert len(pairs) == 4
    for p in pairs:
        assert p.chosen_rating >= 4 and p.rejected_rating <= 2 and p.domain == "kitchen"
        assert (ratings[p.chosen_index], ratings[p.rejected_index]) == (p.chosen_rating, p.rejected_rating)
        assert examples[p.chosen_index].prompt == examples[p.rejected_index].prompt == p.prompt
        assert (examples[p.chosen_index].response, examples[p.rejected_index].response) == (p.chosen, p.rejected)
        assert p.to_preference().party == "kitchen" and p.to_preference().chosen == p.chosen
    used = [p.chosen_index for p in pairs] + [p.rejected_index for p in pairs]
    assert len(used) == len(set(used))


def test_pairs_are_deterministic_under_a_seed(root):
    reviews = load_domain(root, "kitchen")
    runs = [preference_pairs(reviews, 2, 20, np.random.default_rng(s)) for s in (3, 3, 4, 5, 6)]
    assert runs[0] == runs[1]
    assert any(r != runs[0] for r in runs[2:])  # the seed decides who is matched with whom
    assert domain_data(reviews, seed=7) == domain_data(reviews, seed=7)


def test_a_domain_without_pairs_is_an_error(root):
    reviews = load_domain(root, "kitchen")
    with pytest.raises(ValueError, match="no preference pairs for domain kitchen with opening_words=3"):
        preference_pairs(reviews, 3, 20, np.random.default_rng(0))
    with pytest.raises(ValueError, match="opening_words=3"):
        domain_data(reviews, opening_words=3)


def test_load_task_subsamples_examples_but_keeps_pair_reviews(root):
    full = load_task(root, ["kitchen"], seed=1)["kitchen"]
    small = load_task(root, ["kitchen"], seed=1, max_examples=9)["kitchen"]
    assert small.pairs == full.pairs and len(small.examples) == small.counts["examples"] == 9
    in_pairs = {i for p in full.pairs for i in (p.chosen_index, p.rejected_index)}
    assert in_pairs <= {e.review_index for e in small.examples}
    assert [e.review_index for e in small.examples] == sorted(e.review_index for e in small.examples)
    assert len(load_task(root, ["kitchen"], max_examples=2)["kitchen"].examples) == len(in_pairs)
    with pytest.raises(ValueError, match="known: books"):
        load_task(root, ["kitchen", "garden"])


def test_split_pairs_cuts_disjoint_slices(root):
    pairs = load_task(root, ["kitchen"])["kitchen"].pairs
    train, val, test = split_pairs(pairs, (0.5, 0.25, 0.25), np.random.default_rng(0))
    assert (len(train), len(val), len(test)) == (2, 1, 1)
    assert sorted(train + val + test, key=pairs.index) == pairs
    assert split_pairs(pairs, (0.5, 0.25, 0.25), np.random.default_rng(0)) == [train, val, test]
    with pytest.raises(ValueError, match="sum to 1"):
        split_pairs(pairs, (0.5, 0.6), np.random.default_rng(0))


@pytest.mark.real
@pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)")
def test_real_domains_have_2000_reviews_and_enough_pairs():
    task = load_task(SHARED / AMAZON_DIR, opening_words=2)
    assert list(task) == list(DOMAINS)
    for domain, data in task.items():
        assert data.counts["reviews"] == 2000 and data.counts["usable"] >= 1990, domain
        assert data.counts["pairs"] > 100, domain
        assert all(p.chosen_rating > p.rejected_rating for p in data.pairs)
