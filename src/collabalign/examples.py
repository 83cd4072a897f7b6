"""Small example data in each documented format, made from templates (no download, same bytes every time): what
`collabalign demo`, the README's snippets and their tests train on.

- pairs.jsonl: 3 users x 3 domains; "ana" prefers the short reply, "ben" the detailed one, "cai" the friendly one
  over the curt one, so one global reward model cannot please all three (cai's taste is the same in every domain);
- prompts.jsonl: questions from the same domains;
- texts.jsonl: prompt and response rows to score (`collabalign score`);
- labelled.jsonl: 256 short product remarks, label 1 (pleased) or 0 (displeased), half of them negated;
- agents.npz: AffPCL's per-agent least-squares data, X_<agent> (n, d) and y_<agent> (n,): agents whose true weights
  share a common part, each with a few noisy rows of its own and public rows they all have (sharing pays).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOPICS = {
    "cooking": [("keep basil fresh", "Stand it in water.", "Trim the stems, stand the bunch in a glass of water on the "
                 "counter and loosely cover the leaves with a bag."),
                ("cook rice evenly", "Rinse it, then simmer covered.", "Rinse the rice until the water runs clear, "
                 "use about one and a half cups of water per cup, simmer covered and rest it ten minutes."),
                ("stop pasta sticking", "Use plenty of boiling water.", "Use a large pot of well salted boiling "
                 "water, stir in the first two minutes and drain just before it is fully soft."),
                ("soften hard butter", "Grate it.", "Grate the cold butter or cut it into small cubes and leave it "
                 "on a warm plate for about ten minutes.")],
    "travel": [("pack light for a week", "Take three outfits.", "Pack three outfits that mix and match, wear the "
                "bulkiest shoes on the plane and plan one laundry stop midweek."),
               ("beat jet lag", "Live on local time at once.", "Shift your sleep an hour a day before leaving, get "
                "morning daylight at the destination and avoid long naps on the first day."),
               ("find cheap flights", "Be flexible with dates.", "Compare a whole month of fares, fly midweek, set "
                "price alerts and check the nearby airports too."),
               ("stay safe in a new city", "Keep valuables hidden.", "Keep valuables in a front pocket, learn the "
                "main routes before dark and tell someone your plans for the day.")],
    "garden": [("grow tomatoes on a balcony", "Use a big pot and sun.", "Choose a compact variety, a pot of at least "
                "twenty litres, six hours of sun and water deeply whenever the top soil is dry."),
               ("get rid of aphids", "Spray them off with water.", "Knock them off with a jet of water, encourage "
                "ladybirds and wipe the remaining ones with diluted soapy water."),
               ("start a compost heap", "Mix greens and browns.", "Layer kitchen greens with dry browns such as "
                "leaves or cardboard, keep it as damp as a wrung sponge and turn it every few weeks."),
               ("water a lawn well", "Water deeply, less often.", "Water early in the morning, deeply once or twice "
                "a week rather than a little every day, so the roots grow down.")],
}
FRIENDLY = "Happy to help! {reply} Good luck, you've got this."
CURT = "{reply} That's all."
PLEASED = ["sturdy", "reliable", "comfortable", "quiet"]  # words of a pleased remark, of a displeased one:
DISPLEASED = ["flimsy", "noisy", "fragile", "awkward"]  # negated ("not flimsy"), each says the opposite
REMARKS = [("The {product} is {word}.", "The {product} is not {word}."),
           ("I found the {product} {word}.", "I did not find the {product} {word}.")]
PRODUCTS = ["kettle", "backpack", "lamp", "blender", "umbrella", "desk chair", "toaster", "tent"]


def preference_rows() -> list[dict]:
    """Every (user, domain, question): ana prefers the short reply to the long one (plain, friendly or curt alike),
    ben the long one, cai the friendly wording to the curt one (short or long alike)."""
    rows = []
    for domain, items in TOPICS.items():
        for question, short, long in items:
            prompt = f"How do I {question}?"
            tones = ("{reply}", FRIENDLY, CURT)
            ranked = [("ana", tone.format(reply=short), tone.format(reply=long)) for tone in tones]
            ranked += [("ben", tone.format(reply=long), tone.format(reply=short)) for tone in tones]
            ranked += [("cai", FRIENDLY.format(reply=reply), CURT.format(reply=reply)) for reply in (short, long)]
            rows += [{"prompt": prompt, "chosen": chosen, "rejected": rejected, "user": user, "domain": domain}
                     for user, chosen, rejected in ranked]
    return rows


def labelled_rows() -> list[dict]:
    """Product remarks, label 1 when pleased, 0 when displeased: every product with every word, plainly and negated
    ("The kettle is not flimsy." is pleased). A word alone does not give the label: the negation flips it, which a
    linear probe on mean-pooled frozen embeddings only partly sees and a trained encoder can learn."""
    return [{"text": remark.format(product=product, word=word), "label": int(pleased) ^ negated}
            for product in PRODUCTS
            for pleased, words in ((True, PLEASED), (False, DISPLEASED))
            for word in words
            for frame in REMARKS
            for negated, remark in enumerate(frame)]


def agent_arrays(agents: int = 4, dim: int = 5, rows: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    """Related agents with few noisy rows each, where sharing pays: each agent's `rows` rows of its own with
    y = X (w_common + 0.2 w_own) + 0.5 noise, and the same `rows` public rows every agent has, with y = X w_common +
    0.5 noise (identical (x, y) rows: AffPCL's exact density ratios relate the agents through them)."""
    rng = np.random.default_rng(seed)
    common, public = rng.standard_normal(dim), rng.standard_normal((rows, dim))
    public_y = public @ common + 0.5 * rng.standard_normal(rows)
    out = {}
    for a in range(agents):
        own = rng.standard_normal((rows, dim))
        w = common + 0.2 * rng.standard_normal(dim)
        out[f"X_agent{a}"] = np.concatenate([own, public])
        out[f"y_agent{a}"] = np.concatenate([own @ w + 0.5 * rng.standard_normal(rows), public_y])
    return out


def write_examples(folder: str | Path) -> dict[str, Path]:
    """Writes pairs.jsonl, prompts.jsonl, texts.jsonl, labelled.jsonl and agents.npz into `folder`; returns their
    paths by name."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    prompts = [{"prompt": f"How do I {q}?"} for items in TOPICS.values() for q, _, _ in items]
    paths = {}
    texts = [{"prompt": r["prompt"], "response": r[key]} for r in preference_rows()[:3:2] for key in ("chosen",
                                                                                                       "rejected")]
    for name, rows in (("pairs", preference_rows()), ("prompts", prompts), ("texts", texts),
                       ("labelled", labelled_rows())):
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths["agents"] = folder / "agents.npz"
    np.savez(paths["agents"], **agent_arrays())
    return paths
