"""The Multi-Domain Sentiment Dataset (Blitzer et al. 2007) as the meta-reward paper's sentiment task: validated
reviews, fine-tuning examples 𝒟^T and same-prompt preference pairs per domain (books, dvd, electronics, kitchen).

[DECISION] The paper builds its pairs with GPT-4 (extract a prefix, write a less/more positive review); offline and
at CPU scale we form them from the real reviews instead:

- prompt: a review's first `opening_words` words (default 2), shown in their most common original casing, as
  `Continue this {noun} review, which begins: "{opening}"`; reviews are grouped by the lowercased opening, so two
  reviews that begin alike share one prompt;
- response: the next `response_words` words (default 20) of the same whitespace-normalised review text; a review
  shorter than `opening_words + 5` words is skipped and counted;
- pairs: inside each opening group, the reviews rated >= 4 and those rated <= 2 are each shuffled (seeded) and
  zipped, the higher rating chosen; pairs only cross the sentiment boundary (no 5-vs-4 or 2-vs-1, so a rating tie
  can never occur), each review is used at most once, and a pair whose two responses are identical is dropped;
- 𝒟^T (docs/methods/meta-reward.md §5.3, §9.16): every usable review of the domain as an (prompt, response) example,
  both polarities and both members of each pair included, with no rating or label attached.
"""

from __future__ import annotations

import html
import re
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from collabalign.data.errors import DataError
from collabalign.data.jsonl import open_maybe_gzip
from collabalign.data.preferences import PreferencePair
from collabalign.seeding import Seeds

AMAZON_DIR = "amazon-multidomain"  # where the shared data folder keeps the four domain folders
DOMAINS = ("books", "dvd", "electronics", "kitchen")
NOUNS = {"books": "book", "dvd": "DVD", "electronics": "electronics product", "kitchen": "kitchen product"}
FILES = (("positive.review.gz", 1), ("negative.review.gz", 0))  # file order = load order; label from the file
MIN_EXTRA_WORDS = 5  # a usable review has at least this many words after its opening

_FIELD = re.compile(r"<([a-z_]+)>(.*?)</\1>", re.DOTALL)


@dataclass(frozen=True)
class Review:
    """One validated review: `index` is its 1-based record number in its file, `label` 1 for the positive file."""

    domain: str
    index: int
    rating: float
    label: int
    title: str
    text: str


@dataclass(frozen=True)
class Example:
    """One fine-tuning example of 𝒟^T; `review_index` is the review's position in `load_domain`'s list, an id for
    joins only (positive-file reviews come first, so it must never be fed to a model)."""

    prompt: str
    response: str
    domain: str
    review_index: int


@dataclass(frozen=True)
class Pair:
    """Two responses to the same prompt, `chosen` from the higher-rated review; the indices are the reviews'
    positions in the list `preference_pairs` was given."""

    prompt: str
    chosen: str
    rejected: str
    domain: str
    chosen_rating: float
    rejected_rating: float
    chosen_index: int
    rejected_index: int

    def to_preference(self) -> PreferencePair:
        """The project's generic PreferencePair (party = domain), for code that trains on any preference data."""
        return PreferencePair(self.prompt, self.chosen, self.rejected, self.domain,
                              {"chosen_rating": self.chosen_rating, "rejected_rating": self.rejected_rating})


@dataclass
class DomainData:
    """One domain's fine-tuning examples, preference pairs and the counts behind them (for the run's metrics)."""

    examples: list[Example]
    pairs: list[Pair]
    counts: dict[str, int]


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise ValueError(f"unknown Amazon domain {domain!r}; known: {', '.join(DOMAINS)}")


def _parse_record(block: str, domain: str, label: int, path: Path, record: int) -> Review:
    fields = {name: value.strip() for name, value in _FIELD.findall(block)}
    raw = fields.get("rating")
    if raw is None:
        raise DataError(path, record, "rating", "missing field")
    try:
        rating = float(raw)
    except ValueError:
        raise DataError(path, record, "rating", f"not a number: {raw!r}") from None
    if rating not in (1.0, 2.0, 3.0, 4.0, 5.0):
        raise DataError(path, record, "rating", f"must be one of 1..5, got {raw!r}")
    if "review_text" not in fields:
        raise DataError(path, record, "review_text", "missing field")
    text = " ".join(html.unescape(fields["review_text"]).split())
    if not text:
        raise DataError(path, record, "review_text", "empty text")
    title = " ".join(html.unescape(fields.get("title", "")).split())
    return Review(domain, record, rating, label, title, text)


def read_reviews(path: str | Path, domain: str, label: int) -> list[Review]:
    """All records of one .review(.gz) file in file order; the first bad record raises a DataError naming it."""
    path = Path(path)
    try:
        with open_maybe_gzip(path) as f:
            content = f.read().decode("utf-8")
    except (OSError, EOFError, zlib.error) as err:  # a truncated or corrupt gzip stream
        raise DataError(path, None, None, f"unreadable compressed data ({err})") from err
    except UnicodeDecodeError as err:
        raise DataError(path, None, None, f"not valid UTF-8 (byte {err.start})") from err
    blocks = content.split("<review>")[1:]
    if not blocks:
        raise DataError(path, None, None, "no <review> records")
    reviews = []
    for record, block in enumerate(blocks, start=1):
        end = block.find("</review>")
        if end < 0:
            raise DataError(path, record, None, "no closing </review>")
        reviews.append(_parse_record(block[:end], domain, label, path, record))
    return reviews


def load_domain(root: str | Path, domain: str) -> list[Review]:
    """A domain's reviews, positive file then negative file, each in file order; `root` holds the domain folders."""
    _check_domain(domain)
    folder = Path(root) / domain
    return [r for name, label in FILES for r in read_reviews(folder / name, domain, label)]


def split_words(text: str, opening_words: int, response_words: int) -> tuple[str, str] | None:
    """(opening, continuation) of a review text, or None when it has fewer than opening + 5 words."""
    words = text.split()
    if len(words) < opening_words + MIN_EXTRA_WORDS:
        return None
    return " ".join(words[:opening_words]), " ".join(words[opening_words:opening_words + response_words])


def make_prompt(domain: str, opening: str) -> str:
    """The policy's instruction for one opening."""
    return f'Continue this {NOUNS[domain]} review, which begins: "{opening}"'


@dataclass(frozen=True)
class _Formed:
    position: int
    key: str
    prompt: str
    response: str


def _form(reviews: Sequence[Review], opening_words: int, response_words: int) -> tuple[list[_Formed], int]:
    """The usable reviews as (position, group key, prompt, response) and how many were too short."""
    if opening_words < 1 or response_words < 1:
        raise ValueError(f"opening_words and response_words must be >= 1, got {opening_words}, {response_words}")
    split = [(i, r, split_words(r.text, opening_words, response_words)) for i, r in enumerate(reviews)]
    usable = [(i, r, s) for i, r, s in split if s is not None]
    casings: dict[str, Counter[str]] = defaultdict(Counter)
    for _, _, (opening, _) in usable:
        casings[opening.lower()][opening] += 1
    # the shown opening: the most common casing of the group, ties to the lexicographically smallest
    shown = {key: min(c, key=lambda s, c=c: (-c[s], s)) for key, c in casings.items()}
    formed = [_Formed(i, opening.lower(), make_prompt(r.domain, shown[opening.lower()]), response)
              for i, r, (opening, response) in usable]
    return formed, len(reviews) - len(usable)


def _pairs(reviews: Sequence[Review], formed: list[_Formed], rng: np.random.Generator) -> list[Pair]:
    groups: dict[str, list[_Formed]] = defaultdict(list)
    for f in formed:
        groups[f.key].append(f)
    pairs = []
    for key in sorted(groups):
        high = [f for f in groups[key] if reviews[f.position].rating >= 4]
        low = [f for f in groups[key] if reviews[f.position].rating <= 2]
        if not high or not low:
            continue
        high = [high[j] for j in rng.permutation(len(high))]
        low = [low[j] for j in rng.permutation(len(low))]
        for h, lo in zip(high, low, strict=False):
            if h.response != lo.response:
                pairs.append(Pair(h.prompt, h.response, lo.response, reviews[h.position].domain,
                                  reviews[h.position].rating, reviews[lo.position].rating, h.position, lo.position))
    return pairs


def preference_pairs(reviews: Sequence[Review], opening_words: int, response_words: int,
                     rng: np.random.Generator) -> list[Pair]:
    """Same-prompt pairs (rating >= 4 chosen over rating <= 2, each review once), groups in sorted order; raises
    ValueError when a domain gives no pair, since a task without pairs cannot train or test a reward model."""
    formed, _ = _form(reviews, opening_words, response_words)
    pairs = _pairs(reviews, formed, rng)
    _require_pairs(pairs, reviews, opening_words)
    return pairs


def _require_pairs(pairs: list[Pair], reviews: Sequence[Review], opening_words: int) -> None:
    if not pairs:
        domains = ", ".join(sorted({r.domain for r in reviews})) or "(no reviews)"
        raise ValueError(f"no preference pairs for domain {domains} with opening_words={opening_words}: no opening "
                         "is shared by a review rated >= 4 and one rated <= 2 (try fewer opening words)")


def _subsample(formed: list[_Formed], keep: set[int], max_examples: int | None,
               rng: np.random.Generator) -> list[_Formed]:
    """At most `max_examples` of the formed reviews (never fewer than those in `keep`), in their original order."""
    if max_examples is None or max_examples >= len(formed):
        return formed
    others = [f.position for f in formed if f.position not in keep]
    extra = max(0, max_examples - len(keep))
    chosen = keep | {others[j] for j in rng.choice(len(others), size=min(extra, len(others)), replace=False)}
    return [f for f in formed if f.position in chosen]


def domain_data(reviews: Sequence[Review], opening_words: int = 2, response_words: int = 20, seed: int = 0,
                max_examples: int | None = None, max_pairs: int | None = None) -> DomainData:
    """One domain's examples and pairs from its reviews; randomness comes from (seed, domain) only, so a domain's data
    does not depend on which other domains are loaded."""
    if max_examples is not None and max_examples < 1:
        raise ValueError(f"max_examples must be >= 1 or None, got {max_examples}")
    domains = sorted({r.domain for r in reviews})
    if len(domains) > 1:
        raise ValueError(f"domain_data takes one domain's reviews, got {', '.join(domains)}")
    domain = domains[0] if domains else ""
    seeds = Seeds(seed)
    formed, skipped = _form(reviews, opening_words, response_words)
    pairs = _pairs(reviews, formed, seeds.numpy("amazon_reviews.pairs", domain))
    _require_pairs(pairs, reviews, opening_words)
    if max_pairs is not None:
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs}")
        pick = np.sort(seeds.numpy("amazon_reviews.max_pairs", domain).permutation(len(pairs))[:max_pairs])
        pairs = [pairs[j] for j in pick]
    in_pairs = {p.chosen_index for p in pairs} | {p.rejected_index for p in pairs}
    kept = _subsample(formed, in_pairs, max_examples, seeds.numpy("amazon_reviews.examples", domain))
    examples = [Example(f.prompt, f.response, domain, f.position) for f in kept]
    counts = {"reviews": len(reviews), "usable": len(formed), "skipped_short": skipped,
              "groups": len({f.key for f in formed}), "pair_groups": len({p.prompt for p in pairs}),
              "pairs": len(pairs), "examples": len(examples)}
    return DomainData(examples, pairs, counts)


def load_task(root: str | Path, domains: Sequence[str] = DOMAINS, opening_words: int = 2, response_words: int = 20,
              seed: int = 0, max_examples: int | None = None, max_pairs: int | None = None) -> dict[str, DomainData]:
    """Each domain's fine-tuning examples (optionally subsampled, pair reviews always kept) and preference pairs
    (optionally a seeded subset of `max_pairs`, for small runs)."""
    for domain in domains:
        _check_domain(domain)
    return {d: domain_data(load_domain(root, d), opening_words, response_words, seed, max_examples, max_pairs)
            for d in domains}


def split_pairs(pairs: Sequence[Pair], fractions: Sequence[float], rng: np.random.Generator) -> list[list[Pair]]:
    """Shuffle the pairs and cut them into slices of the given fractions (summing to 1), e.g. train/val/test; cuts
    are by pair, so slices may share a prompt (an opening) but never a response."""
    if not fractions or any(f < 0 for f in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be non-negative and sum to 1, got {list(fractions)}")
    order = rng.permutation(len(pairs))
    cuts = np.rint(np.cumsum(fractions) * len(pairs)).astype(int)
    starts = np.concatenate([[0], cuts[:-1]])
    return [[pairs[j] for j in order[a:b]] for a, b in zip(starts, cuts, strict=True)]
