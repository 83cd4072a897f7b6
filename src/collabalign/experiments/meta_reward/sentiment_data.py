"""The sentiment part's data: each domain's fine-tuning examples and preference pairs, and a judge per held-out
domain, from the Amazon reviews or from the user's preference pairs (JSONL rows with a `domain`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from collabalign.data.amazon_reviews import AMAZON_DIR, DomainData, Example, Review, load_domain, load_task
from collabalign.data.formats import file_hash, load_pairs
from collabalign.data.preferences import PreferencePair
from collabalign.experiments.meta_reward.sentiment_config import SentimentConfig
from collabalign.models.sentiment_judge import SentimentJudge
from collabalign.seeding import Seeds


@dataclass
class TaskData:
    """Every domain's data, the judge of every held-out domain, and the sha256 of a JSONL file (None for Amazon)."""

    domains: dict[str, DomainData]
    judges: dict[str, SentimentJudge]
    sha256: str | None


def load_data(cfg: SentimentConfig, root: Path | None, seed: int) -> TaskData:
    """The configured source's data: the Amazon reviews under `root`, or the JSONL file of `cfg.data.path`."""
    if cfg.data.source == "jsonl":
        return jsonl_data(cfg, seed)
    if root is None:
        raise ValueError("the Amazon reviews need a data folder (data_dir, ../shared/data or $COLLABALIGN_DATA)")
    domains = load_task(root / AMAZON_DIR, cfg.domains, cfg.opening_words, cfg.response_words, seed,
                        cfg.max_examples, cfg.max_pairs)
    judges = {d: unseen_judge(load_domain(root / AMAZON_DIR, d), domains[d], cfg, seed) for d in cfg.held_out}
    return TaskData(domains, judges, None)


def unseen_judge(reviews: list[Review], data: DomainData, cfg: SentimentConfig, seed: int) -> SentimentJudge:
    """The domain's judge, fitted only on reviews that are neither fine-tuning text nor in a preference pair (so it
    cannot have memorised the texts A_PL and the policies see), then scored on the domain's pairs as well."""
    used = {e.review_index for e in data.examples} | {i for p in data.pairs for i in (p.chosen_index, p.rejected_index)}
    judge = SentimentJudge(cfg.opening_words, cfg.response_words, seed=seed)
    judge.fit([r for i, r in enumerate(reviews) if i not in used])
    return judge.score_pairs([p.chosen for p in data.pairs], [p.rejected for p in data.pairs])


def jsonl_data(cfg: SentimentConfig, seed: int) -> TaskData:
    """Preference pairs with a `domain` per row: a domain's fine-tuning examples are the distinct (prompt, reply) of
    its pairs (no labels; `max_examples` never drops a pair's reply, so it has no effect here), `max_pairs` a seeded
    subset of its pairs; each held-out domain's judge is fitted on its own pairs (chosen replies positive, rejected
    negative): a file holds no other text, so this judge has seen the pairs it ranks (its pair accuracy says so)."""
    path = str(cfg.data.path)
    by_domain: dict[str, list[PreferencePair]] = {}
    for pair in load_pairs(path, require=("domain",)):
        by_domain.setdefault(pair.attributes["domain"], []).append(pair)
    missing = sorted(set(cfg.domains) - set(by_domain))
    if missing:
        raise ValueError(f"domains {missing} are not in {path}; its domains are {sorted(by_domain)}")
    domains = {}
    for d in cfg.domains:
        pairs = by_domain[d]
        if cfg.max_pairs is not None and cfg.max_pairs < len(pairs):
            pick = sorted(Seeds(seed).numpy("meta_reward/max_pairs", d).permutation(len(pairs))[:cfg.max_pairs])
            pairs = [pairs[j] for j in pick]
        replies = dict.fromkeys((p.prompt, y) for p in pairs for y in (p.chosen, p.rejected))
        examples = [Example(prompt, reply, d, i) for i, (prompt, reply) in enumerate(replies)]
        domains[d] = DomainData(examples, pairs, {"pairs": len(pairs), "examples": len(examples)})
    judges = {d: pair_judge(domains[d].pairs, d, cfg, seed) for d in cfg.held_out}
    return TaskData(domains, judges, file_hash(path))


def pair_judge(pairs: list[PreferencePair], domain: str, cfg: SentimentConfig, seed: int) -> SentimentJudge:
    """The TF-IDF judge fitted on one domain's replies, chosen as positive and rejected as negative (window: a reply's
    first `response_words` words; replies under 5 words are left out)."""
    reviews = [Review(domain, i, rating, label, "", reply) for i, p in enumerate(pairs, start=1)
               for rating, label, reply in ((5.0, 1, p.chosen), (1.0, 0, p.rejected))]
    judge = SentimentJudge(0, cfg.response_words, seed=seed).fit(reviews)
    return judge.score_pairs([p.chosen for p in pairs], [p.rejected for p in pairs])
