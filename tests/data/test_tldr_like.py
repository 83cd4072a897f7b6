"""The TL;DR-like generator and the attribute labelers: determinism, attributes measured from the text, beta
calibration, and labels that follow each labeler's weights."""

import numpy as np
import pytest

from collabalign.data.attribute_labelers import calibrate_beta, draw_labels, labeler_weights, oracle_accuracy
from collabalign.data.tldr_like import ATTRIBUTES, TEMPLATE, attributes, generate

POST = "I have known my girlfriend for two weeks. In Denver we argued about the wedding, which cost me $85."


def test_generator_is_deterministic_per_seed_and_uses_the_template():
    a, b, c = generate(2, 3, 2, seed=0), generate(2, 3, 2, seed=0), generate(2, 3, 2, seed=1)
    assert a.texts == b.texts and np.array_equal(a.attributes, b.attributes) and a.texts != c.texts
    assert len(a.texts) == 2 * 2 * 5 and all(t.startswith("SUBREDDIT: r/") and "\nTL;DR: " in t for t in a.texts)
    assert a.users.tolist() == [0] * 5 + [1] * 5 and a.train.tolist() == ([True] * 3 + [False] * 2) * 2
    assert a.first.tolist() == list(range(0, 20, 2)) and a.other.tolist() == list(range(1, 20, 2))
    np.testing.assert_allclose(a.attributes.mean(0), 0, atol=1e-12)  # standardised over the texts


def test_attributes_are_measured_from_the_text():
    tldr = "Consequently, I maybe had a fight with my girlfriend in Denver and it feels glad and happy!! Any advice?"
    got = dict(zip(ATTRIBUTES, attributes(TEMPLATE.format(sub="tifu", title="t", post=POST, summary=tldr)),
                   strict=True))
    assert got == pytest.approx({"length": np.log1p(len(tldr.split())), "details": 2, "hedging": 1,
                                 "first_person": 2, "sentiment": 2, "exclamation": 2, "question": 1,
                                 "formality": 1})
    casual = attributes(TEMPLATE.format(sub="tifu", title="t", post=POST, summary="OP messed up in Boston tbh."))
    assert dict(zip(ATTRIBUTES, casual, strict=True))["details"] == 0  # Boston is not in this post
    assert dict(zip(ATTRIBUTES, casual, strict=True))["formality"] == -1


def test_every_attribute_varies_across_generated_summaries():
    raw = np.stack([attributes(t) for t in generate(3, 20, 0, seed=2).texts])
    assert (raw.std(0) > 0).all()


@pytest.mark.parametrize("target", [0.6, 0.77, 0.9])
def test_beta_calibration_hits_its_oracle_accuracy(target):
    pairs = generate(5, 40, 0, seed=3)
    margins = pairs.margins(labeler_weights(len(ATTRIBUTES), 5, 0.6, 0.0, np.random.default_rng(0)))
    assert oracle_accuracy(calibrate_beta(margins, target), margins) == pytest.approx(target, abs=1e-9)


def test_unreachable_oracle_accuracy_is_an_error():
    with pytest.raises(ValueError, match="out of reach"):
        calibrate_beta(np.array([0.0, 0.0, 1.0]), 0.9)  # two ties cap it at (0.5 + 0.5 + 1) / 3


def test_agreement_rho_one_gives_identical_labelers_and_weights_have_rank_two():
    rng = np.random.default_rng(0)
    same = labeler_weights(8, 5, 1.0, 0.0, rng)
    assert np.allclose(same, same[0])
    assert np.linalg.matrix_rank(labeler_weights(8, 5, 0.5, 0.0, rng)) == 2
    assert np.linalg.matrix_rank(labeler_weights(8, 5, 0.5, 0.3, rng)) == 5  # the tail breaks the shared rank
    camps = labeler_weights(8, 5, 1.0, 0.0, np.random.default_rng(0), camps=True)  # identical, then odd ones negated
    assert np.allclose(camps[0::2], same[0]) and np.allclose(camps[1::2], -same[0])


def test_labels_follow_the_labelers_weights():
    pairs = generate(2, 400, 0, seed=4)
    weights = np.zeros((2, len(ATTRIBUTES)))
    weights[0, ATTRIBUTES.index("length")] = 1.0  # labeler 0 likes long summaries
    weights[1, ATTRIBUTES.index("length")] = -1.0  # labeler 1 short ones
    beta = calibrate_beta(pairs.margins(weights), 0.8)
    chosen, rejected, margin = draw_labels(pairs, weights, beta, np.random.default_rng(0))
    longer = pairs.attributes[chosen, 0] > pairs.attributes[rejected, 0]
    differs = pairs.attributes[chosen, 0] != pairs.attributes[rejected, 0]
    share = [longer[(pairs.users == u) & differs].mean() for u in (0, 1)]
    assert share[0] > 0.7 and share[1] < 0.3
    assert np.allclose(np.abs(margin), np.abs(pairs.margins(weights)))
