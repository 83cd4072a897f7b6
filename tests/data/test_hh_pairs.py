"""HH-RLHF replies with measurable attributes for simulated labelers: the raw attributes of a reply, and pairs drawn
per labeler from seeded train / test halves that never overlap."""

import numpy as np
import pytest
from transformers import AutoTokenizer

from collabalign.data.hh_pairs import HH_ATTRIBUTES, hh_pairs, hh_texts, reply_vector
from collabalign.models.backbones import MINILM_PACKAGE, package_dir

from .helpers import write_hh


def test_hh_reply_attributes_and_pairs(tmp_path):
    raw = dict(zip(HH_ATTRIBUTES, reply_vector("Sorry, can you tell me what you mean?", True, 9), strict=True))
    assert raw == pytest.approx({"harmless": 1, "length": np.log(10), "apology": 1, "questions": 1,
                                 "second_person": 2})
    tokenizer = AutoTokenizer.from_pretrained(package_dir(MINILM_PACKAGE) / "model")
    turns, replies, attrs = hh_texts(write_hh(tmp_path), tokenizer)
    assert len(turns) == 48 and turns[0] == "Question 0?" and replies[1].startswith("Sure!")
    pairs = hh_pairs(turns, replies, attrs, 2, 4, 3, seed=0)
    assert pairs.users.tolist() == [0] * 7 + [1] * 7
    assert (pairs.first // 2 == pairs.other // 2).all() and (pairs.first != pairs.other).all()
    train_ids, test_ids = set(pairs.first[pairs.train] // 2), set(pairs.first[~pairs.train] // 2)
    assert not train_ids & test_ids  # labelers share pairs, but never across the train / test halves
    with pytest.raises(ValueError, match="cannot draw"):
        hh_pairs(turns, replies, attrs, 2, 13, 3, seed=0)
