"""Anthropic HH-RLHF: split full dialogues into a shared prompt and two final replies, plus text attributes."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from collabalign.data.errors import DataError
from collabalign.data.jsonl import read_jsonl
from collabalign.data.preferences import PreferencePair, PreferenceSet, checked_pair, collect_pairs, require_text
from collabalign.data.words import WORD

HH_FILE = "hh-rlhf/harmless-base-test.jsonl.gz"  # HH-RLHF harmless test pairs, in the shared data folder

ASSISTANT = "\n\nAssistant:"
_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")

# Coarse topic buckets for partitioning and simulated annotators, matched on whole lower-cased words of the
# Human turns only (the assistant's words would leak the answer). The bucket with the most hits wins; ties go to
# the earlier bucket in this order; no hit gives "other".
TOPIC_KEYWORDS: dict[str, frozenset[str]] = {
    "violence": frozenset(
        "kill kills killed killing murder murders murdered hurt hurting punch beat attack attacked fight shoot "
        "shooting stab gun guns knife weapon weapons bomb bombs poison poisoned torture violence violent "
        "die dead death blood strangle choke assault".split()
    ),
    "drugs": frozenset(
        "drug drugs cocaine heroin meth weed marijuana alcohol drunk drink drinking beer vodka pills "
        "opioid opioids lsd ecstasy mdma smoke smoking cigarette cigarettes overdose dealer".split()
    ),
    "crime": frozenset(
        "steal stealing stole stolen rob robbing robbed robbery theft thief shoplift shoplifting burglar "
        "burglary scam scams fraud cheat cheating hack hacking illegal crime crimes criminal police cops "
        "arrest arrested jail prison launder counterfeit kidnap blackmail bribe".split()
    ),
    "sex": frozenset(
        "sex sexual sexy porn pornography naked nude penis vagina breasts boobs dick pussy horny fuck fucking "
        "rape prostitute prostitution hooker orgasm masturbate".split()
    ),
    "hate": frozenset(
        "hate racist racism insult insults insulting slur slurs nigger stupid idiot dumb ugly fat retarded "
        "bitch asshole whore bully bullying curse cuss swear profanity profane kkk racial jew jews jewish muslim "
        "muslims gay gays mexican mexicans immigrants".split()
    ),
}


def split_dialogue(dialogue: str, path: str | Path, line: int | None, name: str) -> tuple[str, str]:
    """Split at the last "\\n\\nAssistant:" into (prompt, final reply), both stripped of surrounding whitespace."""
    cut = dialogue.rfind(ASSISTANT)
    if cut < 0:
        raise DataError(path, line, name, "no '\\n\\nAssistant:' turn")
    return dialogue[:cut].strip(), dialogue[cut + len(ASSISTANT) :].strip()


def hh_pair(chosen: str, rejected: str, path: str | Path, line: int | None) -> PreferencePair:
    """Turn one HH-RLHF row (two full dialogues) into a validated pair whose attributes are hh_attributes."""
    prompt, chosen_reply = split_dialogue(chosen, path, line, "chosen")
    rejected_prompt, rejected_reply = split_dialogue(rejected, path, line, "rejected")
    if not chosen_reply:
        raise DataError(path, line, "chosen", "empty text")
    if rejected_prompt != prompt:
        raise DataError(path, line, "rejected", "prompt differs from chosen's")
    pair = checked_pair(path, line, prompt, chosen_reply, rejected_reply)
    return replace(pair, attributes=hh_attributes(pair))


def hh_attributes(pair: PreferencePair) -> dict[str, Any]:
    """Measurable text attributes of an HH pair (turns, word counts, keyword topic) for partitions and annotators."""
    human_text = " ".join(text for role, text in _turns(pair.prompt) if role == "Human")
    return {
        "n_turns": sum(1 for role, _ in _turns(pair.prompt) if role == "Human"),
        "prompt_words": len(pair.prompt.split()),
        "chosen_words": len(pair.chosen.split()),
        "rejected_words": len(pair.rejected.split()),
        "topic": topic_of(human_text),
    }


def topic_of(text: str) -> str:
    """The TOPIC_KEYWORDS bucket with the most whole-word hits in text (earlier bucket on ties), else "other"."""
    words = WORD.findall(text.lower())
    hits = {topic: sum(w in keywords for w in words) for topic, keywords in TOPIC_KEYWORDS.items()}
    best = max(hits, key=hits.__getitem__)  # max keeps the first of equal counts
    return best if hits[best] > 0 else "other"


def _turns(prompt: str) -> list[tuple[str, str]]:
    """(role, text) for each "Human:"/"Assistant:" turn in a prompt, in order."""
    parts = _TURN.split(prompt)  # [preamble, role, text, role, text, ...]
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def load_hh_rlhf(path: str | Path, drop_invalid: bool = False) -> PreferenceSet:
    """Load an HH-RLHF .jsonl(.gz) file of {"chosen": dialogue, "rejected": dialogue} rows as prompt/reply pairs."""

    def make(line: int, obj: dict[str, Any]) -> list[PreferencePair]:
        return [hh_pair(require_text(obj, "chosen", path, line), require_text(obj, "rejected", path, line), path, line)]

    return collect_pairs(path, read_jsonl(path), make, drop_invalid)
