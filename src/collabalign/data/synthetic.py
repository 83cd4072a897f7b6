"""A tiny synthetic preference set with one learnable signal (politeness), for fast tests and offline fallback."""

from __future__ import annotations

import numpy as np

from collabalign.data.preferences import PreferencePair, PreferenceSet

SYNTHETIC_TOPICS = ("cooking", "travel", "weather", "music", "sports")
_SUBJECTS = {
    "cooking": ("soup", "bread", "pasta", "rice"),
    "travel": ("trains", "hotels", "maps", "flights"),
    "weather": ("rain", "snow", "wind", "clouds"),
    "music": ("piano", "songs", "drums", "guitar"),
    "sports": ("tennis", "football", "running", "swimming"),
}
_QUESTIONS = ("Can you tell me about {s}?", "What should I know about {s}?", "Any tips on {s}?")
_FACTS = ("with {s}, practice helps", "with {s}, a plan helps", "for {s}, the season matters", "{s} can be fun")
_POLITE = ("Sure, happy to help!", "Thank you for asking.", "Good question, kindly note:", "Of course, gladly.")
_RUDE = ("Ugh, whatever.", "That is a stupid question.", "Go away, obviously.", "Fine, if you must, idiot.")


def tiny_preferences(n: int, rng: np.random.Generator) -> PreferenceSet:
    """n pairs where the chosen reply is polite and the rejected one rude, with identical factual content.

    Only the tone differs, so a model that learns the preference must learn politeness; `topic` is an attribute
    for partitioning parties.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    topics = rng.choice(len(SYNTHETIC_TOPICS), n)
    # per pair: subject, question, fact, polite opener, rude opener
    picks = rng.integers(0, [4, len(_QUESTIONS), len(_FACTS), len(_POLITE), len(_RUDE)], size=(n, 5))
    pairs = []
    for t, (subj, q, fact, polite, rude) in zip(topics, picks, strict=True):
        topic = SYNTHETIC_TOPICS[t]
        subject = _SUBJECTS[topic][subj]
        body = _FACTS[fact].format(s=subject).capitalize() + "."
        prompt = _QUESTIONS[q].format(s=subject)
        chosen, rejected = f"{_POLITE[polite]} {body}", f"{_RUDE[rude]} {body}"
        pairs.append(PreferencePair(prompt, chosen, rejected, None, {"topic": topic}))
    return PreferenceSet(pairs, {}, "synthetic:tiny_preferences")
