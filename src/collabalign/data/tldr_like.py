"""An offline TL;DR-like preference set (docs/methods/pshare-lora.md §8.4): templated Reddit-style posts, two candidate
summaries per post from a generator with eight knobs, and the eight attributes measured back FROM THE TEXT (so a
labeler's preference is a function of what a reward model can read):

  length        log(1 + words in the summary)
  details       how many of the post's detail phrases (DETAILS lexicon: who, what, where, how long, how much) the
                summary repeats
  hedging       hedge words (HEDGES)                      first_person  I / me / my / mine / myself
  sentiment     positive minus negative words (lexicons)   exclamation   '!' characters
  question      1 if the summary ends with '?'             formality     formal minus informal markers
"""

from __future__ import annotations

import numpy as np

from collabalign.data.attribute_labelers import AttributePairs, standardise
from collabalign.data.words import WORD
from collabalign.seeding import Seeds

ATTRIBUTES = ("length", "details", "hedging", "first_person", "sentiment", "exclamation", "question", "formality")
TEMPLATE = "SUBREDDIT: r/{sub}\nTITLE: {title}\nPOST: {post}\nTL;DR: {summary}"
SUBREDDITS = {
    "relationships": (("girlfriend", "boyfriend", "wife", "roommate"), ("anniversary", "wedding", "vacation"),
                      "had a fight"),
    "personalfinance": (("landlord", "bank", "employer", "brother"), ("car loan", "credit card", "tax refund"),
                        "lost money"),
    "tifu": (("boss", "neighbour", "coworker", "sister"), ("presentation", "birthday party", "job interview"),
             "messed up"),
    "legaladvice": (("landlord", "employer", "neighbour", "ex"), ("security deposit", "lease", "parking ticket"),
                    "got into a dispute"),
}
PLACES = ("Denver", "Boston", "Seattle", "Austin", "Toronto", "Chicago")
DURATIONS = ("two weeks", "three months", "five years", "a decade")
AMOUNTS = ("$400", "$1,200", "$85", "$3,000")
DETAILS = tuple(sorted({w for who, what, _ in SUBREDDITS.values() for w in who + what} | set(PLACES)
                       | set(DURATIONS) | set(AMOUNTS)))
HEDGES = ("maybe", "probably", "perhaps", "possibly", "somewhat")
POSITIVE = ("glad", "happy", "relieved", "grateful")
NEGATIVE = ("awful", "angry", "sad", "terrible")
FORMAL = ("consequently", "regarding", "therefore", "furthermore")
INFORMAL = ("tbh", "lol", "gonna", "idk", "ugh")
FIRST_PERSON = frozenset(("i", "me", "my", "mine", "myself"))
FILLERS = ("and things got complicated", "and nobody talked for days", "and it is still going on")


def post(sub: str, who: str, what: str, place: str, duration: str, amount: str) -> tuple[str, str]:
    """(title, body) of one post from its slots."""
    title = f"My {who} and the {what}"
    body = f"I have known my {who} for {duration}. In {place} we argued about the {what}, which cost me {amount}."
    return title, body


def summary(slots: dict[str, str], verb: str, knobs: np.ndarray, order: np.ndarray, rng: np.random.Generator) -> str:
    """One candidate summary. knobs = (details 0-4, hedges 0-2, first person 0/1, sentiment -2..2, exclamation 0-2,
    question 0/1, formal -1/0/1, fillers 0-2); `order` is the order in which details are mentioned."""
    n_details, hedges, first, sentiment, exclaim, question, formal, fillers = (int(k) for k in knobs)
    own = "my" if first else "their"
    phrases = {"who": f"with {own} {slots['who']}", "what": f"over the {slots['what']}",
               "place": f"in {slots['place']}", "duration": f"after {slots['duration']}",
               "amount": f"costing {slots['amount']}"}
    keys = ["who", "what", "place", "duration", "amount"]
    words = ["I" if first else "OP", verb] + [phrases[keys[j]] for j in order[:n_details]]
    for h in rng.choice(len(HEDGES), hedges, replace=False):
        words.insert(1, HEDGES[h])
    words += list(FILLERS[:fillers])
    if sentiment:
        lex = POSITIVE if sentiment > 0 else NEGATIVE
        words.append("and it feels " + " and ".join(lex[j] for j in rng.choice(4, abs(sentiment), replace=False)))
    if formal > 0:
        words.insert(0, FORMAL[rng.integers(len(FORMAL))].capitalize() + ",")
    elif formal < 0:
        words.append(INFORMAL[rng.integers(len(INFORMAL))])
    text = " ".join(words) + ("!" * exclaim if exclaim else ".")
    return text + (" Any advice?" if question else "")


def attributes(text: str) -> np.ndarray:
    """The eight raw attributes of one templated text, measured from its POST and TL;DR parts."""
    body = text.split("\nPOST: ", 1)[1]
    post_text, tldr = body.split("\nTL;DR: ", 1)
    words = WORD.findall(tldr.lower())
    valence = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    return np.array([np.log1p(len(tldr.split())), sum(d in post_text and d in tldr for d in DETAILS),
                     sum(w in HEDGES for w in words), sum(w in FIRST_PERSON for w in words), valence,
                     tldr.count("!"), float(tldr.rstrip().endswith("?")),
                     sum(w in FORMAL for w in words) - sum(w in INFORMAL for w in words)], dtype=float)


KNOB_HIGH = np.array([5, 3, 2, 5, 3, 2, 3, 3])  # exclusive upper bounds of the knobs (sentiment, formal shifted)
KNOB_SHIFT = np.array([0, 0, 0, 2, 0, 0, 1, 0])


def generate(n_users: int, n_train: int, n_test: int, seed: int) -> AttributePairs:
    """n_users * (n_train + n_test) posts, each with two independently drawn summaries; pair j of labeler i is
    post j of its block; attributes are standardised over all texts."""
    rng = Seeds(seed).numpy("tldr-like")
    n = n_users * (n_train + n_test)
    texts = []
    subs = list(SUBREDDITS)
    for _ in range(n):
        sub = subs[rng.integers(len(subs))]
        who, what, verb = SUBREDDITS[sub]
        slots = {"who": who[rng.integers(len(who))], "what": what[rng.integers(len(what))],
                 "place": PLACES[rng.integers(len(PLACES))], "duration": DURATIONS[rng.integers(len(DURATIONS))],
                 "amount": AMOUNTS[rng.integers(len(AMOUNTS))]}
        title, body = post(sub, **slots)
        for _ in range(2):
            knobs = rng.integers(0, KNOB_HIGH) - KNOB_SHIFT
            tl = summary(slots, verb, knobs, rng.permutation(5), rng)
            texts.append(TEMPLATE.format(sub=sub, title=title, post=body, summary=tl))
    raw = np.stack([attributes(t) for t in texts])
    per_user = n_train + n_test
    users = np.repeat(np.arange(n_users), per_user)
    train = np.tile(np.arange(per_user) < n_train, n_users)
    return AttributePairs(texts, None, standardise(raw), ATTRIBUTES, users, 2 * np.arange(n), 2 * np.arange(n) + 1,
                          train)
