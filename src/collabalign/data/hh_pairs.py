"""Real replies with simulated labelers: HH-RLHF harmless pairs, each reply scored by five measurable attributes
(the first three as in AffPCL's reward data, docs/methods/affpcl.md §8.3):

  harmless       1 if the reply is the dataset's `chosen` one (the HH harmlessness label), else 0
  length         log(1 + MiniLM word-piece tokens of the reply)
  apology        apology / refusal words (affpcl APOLOGY_WORDS)
  questions      '?' characters in the reply (asks back)
  second_person  you / your / yours / yourself / yourselves (addresses the user)

The text a reward model reads is (last human turn, reply) as a text pair. The texts are the file's pairs (or its
first `pool` pairs) and do not depend on the seed, so their features are cached once; a seed splits the pairs in
halves (train / test pool) and gives each labeler its own pairs from each half.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from collabalign.data.annotator_pools import last_human_turn, reply_attributes
from collabalign.data.attribute_labelers import AttributePairs, standardise
from collabalign.data.hh_rlhf import load_hh_rlhf
from collabalign.data.words import WORD
from collabalign.seeding import Seeds

HH_ATTRIBUTES = ("harmless", "length", "apology", "questions", "second_person")
SECOND_PERSON = frozenset(("you", "your", "yours", "yourself", "yourselves"))


def reply_vector(reply: str, is_chosen: bool, n_tokens: int) -> np.ndarray:
    """The five raw attributes of one reply."""
    words = WORD.findall(reply.lower())
    return np.concatenate([reply_attributes(reply, is_chosen, n_tokens),
                           [reply.count("?"), sum(w in SECOND_PERSON for w in words)]])


def hh_texts(path: str | Path, tokenizer, pool: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    """(last human turns, replies, standardised attributes), rows 2k / 2k+1 = chosen / rejected reply of pair k."""
    pairs = load_hh_rlhf(path, drop_invalid=True).pairs
    pairs = pairs[:pool] if pool > 0 else pairs
    turns, replies, raw = [], [], []
    for p in pairs:
        turn = last_human_turn(p.prompt)
        for reply, is_chosen in ((p.chosen, True), (p.rejected, False)):
            turns.append(turn)
            replies.append(reply)
            raw.append(reply_vector(reply, is_chosen, len(tokenizer(reply, add_special_tokens=False)["input_ids"])))
    return turns, replies, standardise(np.stack(raw))


def hh_pairs(turns: list[str], replies: list[str], attributes: np.ndarray, n_users: int, n_train: int,
             n_test: int, seed: int) -> AttributePairs:
    """Each labeler's n_train pairs from a seeded half of the pairs and n_test from the other half (labelers may
    share pairs, never across halves), each shown in a seeded order (x0, x1)."""
    n_pairs = len(turns) // 2
    rng = Seeds(seed).numpy("hh-pairs")
    perm = rng.permutation(n_pairs)
    halves = perm[: n_pairs // 2], perm[n_pairs // 2:]
    if n_train > len(halves[0]) or n_test > len(halves[1]):
        raise ValueError(f"{n_pairs} HH pairs give halves of {len(halves[0])} / {len(halves[1])}; "
                         f"cannot draw {n_train} train / {n_test} test pairs per labeler")
    picks = [np.concatenate([rng.choice(halves[0], n_train, replace=False),
                             rng.choice(halves[1], n_test, replace=False)]) for _ in range(n_users)]
    rows = np.concatenate(picks)
    flip = rng.integers(2, size=len(rows))
    users = np.repeat(np.arange(n_users), n_train + n_test)
    train = np.tile(np.arange(n_train + n_test) < n_train, n_users)
    return AttributePairs(turns, replies, attributes, HH_ATTRIBUTES, users, 2 * rows + flip, 2 * rows + 1 - flip,
                          train)
