"""The text part (spec §8.4): personalised MiniLM reward models for simulated labelers who weigh measurable
attributes of the texts (w_i = M c_i), on the offline TL;DR-like generator and on real HH-RLHF replies, or the real
Reddit TL;DR labelers, or the users of a preference-pairs JSONL (`text.data`); every method over seeds, mean ± std
per labeler, the paper's ordering as claims per source (`ordering.py`) after a claim that the source is learned at
all, a Fig. 2-like plot."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from collabalign.claims import Claim, confirmed, not_run, superiority
from collabalign.data.attribute_labelers import AttributePairs, calibrate_beta, describe, draw_labels, labeler_weights
from collabalign.data.errors import DataError
from collabalign.data.formats import file_hash, load_pairs
from collabalign.data.hh_pairs import hh_pairs, hh_texts
from collabalign.data.hh_rlhf import HH_FILE
from collabalign.data.paths import shared_data_dir
from collabalign.data.tldr import load_tldr_users
from collabalign.data.tldr_like import generate
from collabalign.experiments.pshare_lora.config import Config, TextConfig
from collabalign.experiments.pshare_lora.ordering import ordering_claims
from collabalign.experiments.pshare_lora.plots import labeler_bars
from collabalign.methods.pshare_lora import LABELS, Prefs
from collabalign.methods.pshare_lora.entry import split_per_user
from collabalign.methods.pshare_lora.text import encode, fit, prefs_from_pairs
from collabalign.methods.pshare_lora.train import per_user_mean
from collabalign.models.backbones import Backbone, load_backbone
from collabalign.models.cached import TextCache
from collabalign.models.reward import pair_correct
from collabalign.runs import Part, RunDir, cached_json, fingerprint
from collabalign.seeding import Seeds
from collabalign.selection import best, held_out_slice

SOURCE_NAMES = {"tldr_like": "TL;DR-like", "hh": "HH-RLHF", "tldr": "Reddit TL;DR", "jsonl": "JSONL pairs"}
TEXT_SELECTION = {"run", "seeds", "sources", "methods", "lr_grid"}  # which fits run (each fit's lr: its name)
LEARNED = superiority(
    "the source is learned: LoRA-global above chance and above the frozen backbone with a trained head",
    "held-out accuracy (fraction), paired over seeds: LoRA-global above 0.5 (chance) and above the frozen backbone "
    "with one trained score head (its lr from the same grid), Holm over the 2 cells; smallest effect 0. Where it is "
    "not reproduced, the source's ordering claims say little about the methods")
LEARNED_PERSONAL = superiority(
    "the source is learned by personal adapters: LoRA-local above chance and above the frozen backbone with a "
    "trained head", "as the claim above with LoRA-local in place of LoRA-global. Written after that claim came out "
    "inconclusive on both sources in issue 16's main run: one global model cannot fit labelers who disagree, so "
    "LoRA-global is a weak witness of whether a personalised task is learned", post_hoc=True)
LEARNED_BEYOND_FEATURES = superiority(
    "the source is learned beyond frozen features: LoRA-local above chance and above the frozen backbone with a head "
    "per user", "held-out accuracy (fraction), paired over seeds: LoRA-local above 0.5 and above the frozen backbone "
    "with per-user score heads (the personalised floor: beating one shared head shows that personalisation matters, "
    "this floor that the adapters learn beyond the frozen features), Holm over the 2 cells")
# each learned claim, the method it tests and the frozen floor it is compared with
LEARNED_CLAIMS = ((LEARNED, "global", "frozen"), (LEARNED_PERSONAL, "local", "frozen"),
                  (LEARNED_BEYOND_FEATURES, "local", "frozen_per_user"))


def labelled(pairs: AttributePairs, cfg: TextConfig, source: str, seed: int) -> tuple[Prefs, Prefs, dict]:
    """Train / test preferences from the seed's labelers, and the labelers' description (weights, beta, oracle)."""
    rng = Seeds(seed).numpy(f"labelers-{source}")
    weights = labeler_weights(len(pairs.names), cfg.users, cfg.rho, cfg.tail, rng, cfg.camps)
    beta = calibrate_beta(pairs.margins(weights), cfg.oracle_accuracy)
    chosen, rejected, margin = draw_labels(pairs, weights, beta, rng)
    users, margin = torch.from_numpy(pairs.users), torch.from_numpy(margin)
    prefs = Prefs(users, torch.from_numpy(chosen), torch.from_numpy(rejected))
    train, test = torch.from_numpy(pairs.train), torch.from_numpy(~pairs.train)
    oracle = per_user_mean(users[test], pair_correct(margin[test], torch.zeros(int(test.sum()))), cfg.users)
    info = {"beta": round(beta, 6), "oracle_per_user": [round(float(a), 4) for a in oracle],
            "oracle_accuracy": round(float(oracle.mean()), 6), "weights": weights}
    return prefs[train], prefs[test], info


def fit_key(cfg: TextConfig, source: str) -> str:
    """The fingerprint a source's fits are cached under: the text settings less the fit selection and `data`, and
    for the JSONL source its `data` section and the file's sha256."""
    unset = {"camps"} if not cfg.camps else set()  # settings added later key their runs only when switched on
    key = fingerprint(cfg.model_dump(mode="json", exclude=TEXT_SELECTION | {"data"} | unset))
    if source != "jsonl":
        return key
    return fingerprint({"text": key, "data": cfg.data.model_dump(mode="json"), "sha256": file_hash(cfg.data.path)})


def text_part(config: Config, run_dir: RunDir, progress: bool, backbone: Backbone | None = None) -> Part:
    """Every method on every source and text seed, each at its lr chosen from one grid on a held-out slice of the
    first seed's training pairs (each fit cached in run_dir/pshare_text_fits, so a stopped run continues where it
    stopped); claims per source, the per-labeler table and plot, and notes."""
    cfg, seeds = config.text, config.text_seeds()
    backbone = backbone or load_backbone(cfg.backbone)
    backbone.model.to(getattr(torch, cfg.dtype))
    part = Part()

    def cached_fit(source: str, users: int, tag: str, cache: TextCache, train: Prefs, test: Prefs, method: str,
                   lr: float, seed: int) -> dict:
        return cached_json(run_dir.path / "pshare_text_fits" / f"{source}__{method}__lr{lr:g}__{tag}.json",
                           fit_key(cfg, source),
                           partial(fit, backbone, cache, train, test, method, users, cfg.training(lr), seed))

    for source in cfg.sources:
        acc: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        oracle, hh_cache, real, chosen, users = [], None, None, {}, cfg.users
        for seed in seeds:
            start = time.perf_counter()
            info = {}
            if source == "tldr":  # real labels: the same users and pairs for every seed (selected with seed 42)
                train, test, cache = real = real or tldr_data(cfg, backbone)
            elif source == "jsonl":  # the file's users and pairs, encoded once; each seed holds out its own pairs
                prefs, cache, names = real = real or jsonl_data(cfg, backbone)
                users = len(names)
                train, test = jsonl_split(prefs, names, cfg.data.test_fraction, seed)
            else:
                pairs, cache, hh_cache = source_data(source, cfg, seed, backbone, hh_cache)
                train, test, info = labelled(pairs, cfg, source, seed)
                oracle.append(info["oracle_per_user"])
                if seed == seeds[0]:
                    part.notes.append(f"{SOURCE_NAMES[source]} labelers (seed {seed}, beta {info['beta']:.3g}; "
                                      "attribute weights, largest first): "
                                      + "; ".join(describe(info["weights"], pairs.names)))
            if seed == seeds[0]:
                chosen = choose_lrs(cfg, source, train, seed, partial(cached_fit, source, users, "select", cache))
                part.metrics[f"text_{source}_lr"] = chosen
            for method in cfg.methods:
                lr = chosen[method]["lr"]
                res = cached_fit(source, users, f"seed{seed}", cache, train, test, method, lr, seed)
                part.records.append({"experiment": "text", "source": source, "method": method, "seed": seed,
                                     "lr": lr, **res, **{k: info[k] for k in ("oracle_accuracy", "oracle_per_user",
                                                                             "beta") if info}})
                acc[method]["accuracy"].append(res["accuracy"])
                acc[method]["per_user"].append(res["accuracy_per_user"])
                if progress:
                    print(f"text {source} seed {seed} {method}: accuracy {res['accuracy']:.4f}", file=sys.stderr)
            if progress:
                print(f"text {source} seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        add_source(part, source, users, acc, np.asarray(oracle), cfg, run_dir)
        part.notes.append(lr_table(SOURCE_NAMES[source], cfg, chosen))
    return part


def choose_lrs(cfg: TextConfig, source: str, train: Prefs, seed: int, fit_on) -> dict[str, dict]:
    """Each method's lr from the grid: fit on the seed's training pairs less a held-out slice (select_fraction of
    each labeler's, seeded), scored by held-out accuracy on that slice; method -> {lr, selection accuracies}. A
    one-value grid needs no fits. `fit_on(train, test, method, lr, seed)` runs one fit."""
    if len(cfg.lr_grid) == 1:
        return {m: {"lr": cfg.lr_grid[0], "selection_accuracy": {}} for m in cfg.methods}
    fit_rows, select_rows = held_out_slice(train.users.numpy(), cfg.select_fraction,
                                           Seeds(seed).numpy(f"text-select-{source}"))
    out = {}
    for method in cfg.methods:
        scores = {lr: fit_on(train[fit_rows], train[select_rows], method, lr, seed)["accuracy"] for lr in cfg.lr_grid}
        out[method] = {"lr": best(scores), "selection_accuracy": {f"{lr:g}": a for lr, a in scores.items()}}
    return out


def lr_table(name: str, cfg: TextConfig, chosen: dict[str, dict]) -> str:
    """Markdown: each method's held-out-slice accuracy per lr of the grid and the lr it runs with."""
    if len(cfg.lr_grid) == 1:
        return f"{name}: every method at lr {cfg.lr_grid[0]:g} (a one-value grid: nothing chosen)."
    lines = [f"{name} learning rate, chosen per method from one grid on a held-out {cfg.select_fraction:.0%} of each "
             "labeler's training pairs (first seed; the test pairs are never used to choose):", "",
             "| method | " + " | ".join(f"lr {lr:g}" for lr in cfg.lr_grid) + " | chosen |",
             "|---|" + "---|" * (len(cfg.lr_grid) + 1)]
    for m, c in chosen.items():
        lines.append(f"| {LABELS[m]} | " + " | ".join(f"{a:.4f}" for a in c["selection_accuracy"].values())
                     + f" | {c['lr']:g} |")
    return "\n".join(lines)


def tldr_data(cfg: TextConfig, backbone: Backbone) -> tuple[Prefs, Prefs, TextCache]:
    """The real TL;DR comparisons of the top `users` labelers (balanced, seed 42 as the paper's code), their texts
    (post + summary) encoded once as `prefs_from_pairs` lays them out, train pairs first."""
    train, valid, _ = load_tldr_users(cfg.data_root, cfg.users, 42, cfg.n_train or None, cfg.n_test or None)
    pairs = [*train, *valid]
    texts, prefs = prefs_from_pairs(pairs, [int(p.party) for p in pairs])
    cache = encode(backbone, texts, cfg.max_length, cfg.lora_blocks, truncation_side=cfg.truncation_side)
    return prefs[: len(train)], prefs[len(train):], cache


def jsonl_data(cfg: TextConfig, backbone: Backbone) -> tuple[Prefs, TextCache, list[str]]:
    """The pairs of `cfg.data` (a `user` in every row) and their texts encoded once as `prefs_from_pairs` lays them
    out; user i is names[i] (the file's users, sorted)."""
    pairs = load_pairs(cfg.data.path, require=("user",))
    names = sorted({p.party for p in pairs})
    index = {name: i for i, name in enumerate(names)}
    texts, prefs = prefs_from_pairs(pairs.pairs, [index[p.party] for p in pairs])
    cache = encode(backbone, texts, cfg.max_length, cfg.lora_blocks, truncation_side=cfg.truncation_side)
    return prefs, cache, names


def jsonl_split(prefs: Prefs, names: list[str], test_fraction: float, seed: int) -> tuple[Prefs, Prefs]:
    """(train, test): `test_fraction` of each user's pairs held out, drawn as `train_pshare_lora` draws them."""
    train, test = split_per_user(prefs.users.tolist(), test_fraction, Seeds(seed).numpy("pshare-lora-split"), names)
    return prefs[train], prefs[test]


def source_data(source: str, cfg: TextConfig, seed: int, backbone: Backbone,
                hh_cache: tuple | None) -> tuple[AttributePairs, TextCache, tuple | None]:
    """The seed's pairs and their cached features: TL;DR-like texts are drawn per seed, HH texts encoded once."""
    if source == "tldr_like":
        pairs = generate(cfg.users, cfg.n_train, cfg.n_test, seed)
        return pairs, encode(backbone, pairs.texts, cfg.max_length, cfg.lora_blocks), None
    if hh_cache is None:
        root = shared_data_dir()
        if root is None or not (root / HH_FILE).is_file():
            raise DataError(Path(root or "../shared/data") / HH_FILE, None, None, "no such file; set "
                            "COLLABALIGN_DATA or drop 'hh' from text.sources")
        turns, replies, attrs = hh_texts(root / HH_FILE, backbone.tokenizer, cfg.hh_pool)
        cache = encode(backbone, turns, cfg.max_length, cfg.lora_blocks, replies, truncation_side="right")
        hh_cache = (turns, replies, attrs, cache)
    turns, replies, attrs, cache = hh_cache
    return hh_pairs(turns, replies, attrs, cfg.users, cfg.n_train, cfg.n_test, seed), cache, hh_cache


def add_source(part: Part, source: str, users: int, acc: dict, oracle: np.ndarray, cfg: TextConfig,
               run_dir: RunDir) -> None:
    """Claims (named with the source), metrics, the table and the per-labeler plot of one source."""
    name = SOURCE_NAMES[source]
    accuracy = {m: v["accuracy"] for m, v in acc.items()}
    learned = [learned_claim(accuracy, name, claim, method, floor) for claim, method, floor in LEARNED_CLAIMS]
    part.claims += learned + ordering_claims(accuracy, source=name)
    if not any(confirmed(c) for c in learned):
        verdicts = "; ".join(f"{LABELS[m]} over {LABELS[f]}: {c['verdict']}"
                             for (_, m, f), c in zip(LEARNED_CLAIMS, learned, strict=True))
        part.notes.append(f"**{name}: learning not shown.** No learned claim is reproduced ({verdicts}), so its "
                          "ordering claims rank methods on a source not shown to be learned above chance and the "
                          "frozen backbone.")
    part.metrics[f"text_{source}"] = {LABELS[m]: round(float(np.mean(v["accuracy"])), 4) for m, v in acc.items()}
    if oracle.size:
        part.metrics[f"text_{source}"]["oracle"] = round(float(oracle.mean()), 4)
    part.notes.append(table(name, acc, cfg.methods, oracle))
    part.notes.append(f"{name}: {data_note(source, cfg, users)}; "
                      f"{cfg.backbone} with LoRA "
                      f"(r {cfg.rank}, alpha {cfg.alpha}, dropout {cfg.dropout}) on {'/'.join(cfg.targets)} of the top "
                      f"{cfg.lora_blocks} blocks (lower blocks cached), max {cfg.max_length} tokens; Adam (lr below)"
                      f"{' linear to 0' if cfg.linear_schedule else ''}, batch {cfg.batch_size}, {cfg.epochs} epochs' "
                      "steps for every method (G: 2/3 global then lr/3; WU: 0.1 global; Share Rep: the bottom 70% of "
                      "the blocks frozen, per-user LoRA above and a head per user, from the first step; its same-head "
                      "variant: one head for all users; its phased ablation: a global phase first, then that split "
                      "at lr/3).")
    labeler_bars(run_dir, source, name, acc, cfg.methods, oracle)


def data_note(source: str, cfg: TextConfig, users: int) -> str:
    """Where a source's users and pairs come from, for its note."""
    if source == "jsonl":
        return (f"the {users} users of {cfg.data.path} with their own pairs, {cfg.data.test_fraction:g} of each "
                "user's held out per seed")
    labels = ("the labelers' own comparisons (top labelers by train count, balanced)" if source == "tldr" else
              f"rho {cfg.rho}, eta {cfg.tail}, {'two camps (odd labelers negated), ' if cfg.camps else ''}"
              f"beta set for oracle accuracy {cfg.oracle_accuracy}")
    return f"{cfg.users} labelers x {cfg.n_train} train / {cfg.n_test} test pairs, {labels}"


def learned_claim(accuracy: dict[str, list[float]], name: str, learned: Claim = LEARNED, method: str = "global",
                  floor: str = "frozen") -> dict:
    """A learned claim on one source (method -> accuracy per seed): `method` above chance and the frozen `floor`
    (one shared head, or a head per user), or not run without the two."""
    claim = replace(learned, name=f"{name}: {learned.name}")
    if method not in accuracy or floor not in accuracy:
        return not_run(claim, f"needs {LABELS[method]} and {LABELS[floor]} (text.methods: {method}, {floor})")
    trained, frozen = np.asarray(accuracy[method]), np.asarray(accuracy[floor])
    return claim.decide_cells({"chance": (trained, np.full_like(trained, 0.5)), floor: (trained, frozen)},
                              mean_accuracy={LABELS[method]: float(trained.mean()), floor: float(frozen.mean())})


def table(name: str, acc: dict, methods: list[str], oracle: np.ndarray) -> str:
    """Markdown: accuracy and each labeler's accuracy, mean ± std over seeds, one row per method, then the oracle."""
    n = len(acc[methods[0]]["per_user"][0])
    seeds = len(acc[methods[0]]["accuracy"])
    lines = [f"{name} comparison (held-out preference accuracy, ties 0.5; mean ± std over {seeds} seeds):", "",
             "| method | accuracy | " + " | ".join(f"labeler {i}" for i in range(n)) + " |",
             "|---|---|" + "---|" * n]
    cell = (lambda v: f"{np.mean(v):.4f} ± {np.std(v):.4f}")
    for m in methods:
        per_user = np.asarray(acc[m]["per_user"])
        lines.append(f"| {LABELS[m]} | {cell(acc[m]['accuracy'])} | "
                     + " | ".join(cell(per_user[:, i]) for i in range(n)) + " |")
    if oracle.size:
        lines.append(f"| oracle | {cell(oracle.mean(1))} | " + " | ".join(cell(oracle[:, i]) for i in range(n))
                     + " |")
    return "\n".join(lines)
