"""The TF-IDF sentiment judge: scores in [0, 1], deterministic fits, one-domain and both-label checks, and (real data)
held-out accuracy on response windows clearly above chance."""

import numpy as np
import pytest

from collabalign.data.amazon_reviews import AMAZON_DIR, Review, load_domain
from collabalign.data.paths import shared_data_dir
from collabalign.models.sentiment_judge import SentimentJudge

SHARED = shared_data_dir()
GOOD = ["great", "wonderful", "excellent", "love", "perfect", "best"]
BAD = ["awful", "terrible", "broken", "hate", "useless", "worst"]


def synthetic(n: int = 60, domain: str = "kitchen") -> list[Review]:
    """Reviews whose continuation carries their label's words (with some shared neutral words)."""
    reviews = []
    for i in range(n):
        label = i % 2
        words = GOOD if label else BAD
        text = " ".join(["This", "thing", *(words[(i + k) % 6] for k in range(4)), "it", "is", "a", "product", "I",
                         "used", "every", "day"])
        reviews.append(Review(domain, i // 2 + 1, 5.0 if label else 1.0, label, "", text))
    return reviews


def test_synthetic_fit_scores_in_unit_interval_and_is_deterministic():
    judge = SentimentJudge(seed=3).fit(synthetic())
    scores = judge.score(["love it, perfect and the best", "terrible, broken, the worst", "a product"])
    assert scores.shape == (3,) and np.all((scores >= 0) & (scores <= 1))
    assert scores[0] > 0.5 > scores[1]
    assert judge.accuracy == 1.0 and judge.n_test == 12 and judge.n_train == 48
    again = SentimentJudge(seed=3).fit(synthetic())
    assert np.array_equal(again.score(["love it", "hate it"]), judge.score(["love it", "hate it"]))
    info = judge.describe()
    assert info["domain"] == "kitchen" and info["kind"] == "tfidf-logreg" and info["vocabulary"] > 0
    assert judge.score([]).shape == (0,)


def test_judge_refuses_mixed_domains_one_label_and_scoring_before_fit():
    with pytest.raises(ValueError, match="exactly one held-out domain"):
        SentimentJudge().fit(synthetic(20) + synthetic(20, "books"))
    with pytest.raises(ValueError, match="needs both labels"):
        SentimentJudge().fit([r for r in synthetic() if r.label == 1])
    with pytest.raises(RuntimeError, match="before fit"):
        SentimentJudge().score(["text"])
    with pytest.raises(ValueError, match="test_fraction"):
        SentimentJudge(test_fraction=1.0)


@pytest.mark.real
@pytest.mark.skipif(SHARED is None, reason="../shared/data not found (set COLLABALIGN_DATA to its folder)")
def test_real_judge_beats_chance_on_held_out_windows():
    reviews = load_domain(SHARED / AMAZON_DIR, "kitchen")
    judge = SentimentJudge().fit(reviews)
    # 20-word windows after a 2-word opening often carry little sentiment: ~0.7 measured, full texts ~0.85
    assert judge.n_test == 400 and judge.accuracy > 0.64 and judge.accuracy_full > 0.75
    scores = judge.score(["This is the best blender I have ever owned, it works perfectly",
                          "It broke after two days and the company would not refund my money"])
    assert scores[0] > 0.5 > scores[1]


@pytest.mark.skipif(SHARED is None, reason="../shared/data not found")
def test_the_experiments_judge_never_sees_a_fine_tuning_or_pair_review():
    from collabalign.data.amazon_reviews import domain_data
    from collabalign.experiments.meta_reward.sentiment_config import SentimentConfig
    from collabalign.experiments.meta_reward.sentiment_data import unseen_judge

    reviews = load_domain(SHARED / AMAZON_DIR, "kitchen")
    data = domain_data(reviews, max_examples=300)
    judge = unseen_judge(reviews, data, SentimentConfig(), seed=0)
    used = {e.review_index for e in data.examples} | {i for p in data.pairs for i in (p.chosen_index,
                                                                                      p.rejected_index)}
    assert len(used) >= 300 and judge.n_train + judge.n_test <= len(reviews) - len(used)
    assert judge.accuracy > 0.6 and 0.5 < judge.pair_accuracy <= 1  # ranks pairs it never saw better than chance
    with pytest.raises(ValueError, match="as many chosen as rejected"):
        judge.score_pairs(["a"], [])
