"""P-ShareLoRA reproduction, text part (spec §8.4): personalised MiniLM reward models for 5 simulated labelers who
weigh measurable attributes of the texts (w_i = M c_i), on the offline TL;DR-like generator and on real HH-RLHF
replies; every method over seeds, mean ± std per labeler, the paper's ordering as claims, a Fig. 2-like plot."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from typing import Literal

import numpy as np
import torch

from collabalign.config import Strict
from collabalign.data.attribute_labelers import AttributePairs, calibrate_beta, describe, draw_labels, labeler_weights
from collabalign.data.paths import shared_data_dir
from collabalign.data.tldr_like import generate
from collabalign.experiments.pshare_lora_claims import ordering_claims
from collabalign.methods.pshare_lora import LABELS, METHODS, Prefs
from collabalign.methods.pshare_lora.hh_pairs import hh_pairs, hh_texts
from collabalign.methods.pshare_lora.text import FeatureCache, TextTraining, encode, fit, per_user_mean
from collabalign.models.backbones import Backbone, load_backbone
from collabalign.models.reward import pair_correct
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

Source = Literal["tldr_like", "hh"]
SOURCE_NAMES = {"tldr_like": "TL;DR-like", "hh": "HH-RLHF"}
HH_FILE = "hh-rlhf/harmless-base-test.jsonl.gz"


class TextConfig(Strict):
    run: bool = False
    sources: list[Source] = ["tldr_like", "hh"]
    seeds: list[int] | None = None  # None: the experiment's seeds (text runs cost far more than synthetic ones)
    backbone: str = "minilm-l6"
    users: int = 5
    n_train: int = 300  # pairs per labeler
    n_test: int = 300
    rho: float = 0.6  # agreement of the labelers' attribute weights
    tail: float = 0.0  # eta: individual deviations of the weights
    oracle_accuracy: float = 0.77  # beta is calibrated to this expected agreement with the labeler's own reward
    hh_pool: int = 0  # HH pairs used (the file's first ones); 0: all 2,312
    max_length: int = 96
    lora_blocks: int = 2
    rank: int = 8
    alpha: float = 4.0
    dropout: float = 0.05
    batch_size: int = 32
    epochs: float = 3.0
    lr: float = 3e-3  # tuned once on LoRA-global (probe: 3e-4 .497, 1e-3 .563, 3e-3 .647, 1e-2 .643), for all
    linear_schedule: bool = True
    methods: list[str] = [m for m in METHODS if m != "full"]

    def training(self) -> TextTraining:
        return TextTraining(self.rank, self.alpha, self.dropout, self.batch_size, self.epochs, self.lr,
                            self.linear_schedule)


def labelled(pairs: AttributePairs, cfg: TextConfig, source: str, seed: int) -> tuple[Prefs, Prefs, dict]:
    """Train / test preferences from the seed's labelers, and the labelers' description (weights, beta, oracle)."""
    rng = Seeds(seed).numpy(f"labelers-{source}")
    weights = labeler_weights(len(pairs.names), cfg.users, cfg.rho, cfg.tail, rng)
    beta = calibrate_beta(pairs.margins(weights), cfg.oracle_accuracy)
    chosen, rejected, margin = draw_labels(pairs, weights, beta, rng)
    users, margin = torch.from_numpy(pairs.users), torch.from_numpy(margin)
    prefs = Prefs(users, torch.from_numpy(chosen), torch.from_numpy(rejected))
    train, test = torch.from_numpy(pairs.train), torch.from_numpy(~pairs.train)
    oracle = per_user_mean(users[test], pair_correct(margin[test], torch.zeros(int(test.sum()))), cfg.users)
    info = {"beta": round(beta, 6), "oracle_per_user": [round(float(a), 4) for a in oracle],
            "oracle_accuracy": round(float(oracle.mean()), 6), "weights": weights}
    return prefs[train], prefs[test], info


def text_part(cfg: TextConfig, seeds: list[int], run_dir: RunDir, progress: bool,
              backbone: Backbone | None = None) -> Part:
    """Every method on every source and seed; claims per source, the per-labeler table and plot, and notes."""
    backbone = backbone or load_backbone(cfg.backbone)
    seeds = cfg.seeds if cfg.seeds is not None else seeds
    part = Part()
    for source in cfg.sources:
        acc: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        oracle, names, hh_cache = [], (), None
        for seed in seeds:
            start = time.perf_counter()
            pairs, cache, hh_cache = source_data(source, cfg, seed, backbone, hh_cache)
            train, test, info = labelled(pairs, cfg, source, seed)
            oracle.append(info["oracle_per_user"])
            if seed == seeds[0]:
                names = pairs.names
                part.notes.append(f"{SOURCE_NAMES[source]} labelers (seed {seed}, beta {info['beta']:.3g}; "
                                  "attribute weights, largest first): " + "; ".join(describe(info["weights"], names)))
            for method in cfg.methods:
                res = fit(backbone, cache, train, test, method, cfg.users, cfg.training(), seed)
                part.records.append({"experiment": "text", "source": source, "method": method, "seed": seed, **res,
                                     "oracle_accuracy": info["oracle_accuracy"],
                                     "oracle_per_user": info["oracle_per_user"], "beta": info["beta"]})
                acc[method]["accuracy"].append(res["accuracy"])
                acc[method]["per_user"].append(res["accuracy_per_user"])
                if progress:
                    print(f"text {source} seed {seed} {method}: accuracy {res['accuracy']:.4f}", file=sys.stderr)
            if progress:
                print(f"text {source} seed {seed}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        add_source(part, source, acc, np.asarray(oracle), cfg, run_dir)
    return part


def source_data(source: str, cfg: TextConfig, seed: int, backbone: Backbone,
                hh_cache: tuple | None) -> tuple[AttributePairs, FeatureCache, tuple | None]:
    """The seed's pairs and their cached features: TL;DR-like texts are drawn per seed, HH texts encoded once."""
    if source == "tldr_like":
        pairs = generate(cfg.users, cfg.n_train, cfg.n_test, seed)
        return pairs, encode(backbone, pairs.texts, cfg.max_length, cfg.lora_blocks), None
    if hh_cache is None:
        root = shared_data_dir()
        if root is None or not (root / HH_FILE).is_file():
            raise FileNotFoundError(f"{HH_FILE} not found under the shared data folder ({root}); set "
                                    "COLLABALIGN_DATA or drop 'hh' from text.sources")
        turns, replies, attrs = hh_texts(root / HH_FILE, backbone.tokenizer, cfg.hh_pool)
        cache = encode(backbone, turns, cfg.max_length, cfg.lora_blocks, replies, truncation_side="right")
        hh_cache = (turns, replies, attrs, cache)
    turns, replies, attrs, cache = hh_cache
    return hh_pairs(turns, replies, attrs, cfg.users, cfg.n_train, cfg.n_test, seed), cache, hh_cache


def add_source(part: Part, source: str, acc: dict, oracle: np.ndarray, cfg: TextConfig, run_dir: RunDir) -> None:
    """Claims (prefixed with the source), metrics, the table and the per-labeler plot of one source."""
    name = SOURCE_NAMES[source]
    for c in ordering_claims(acc):
        part.claims.append({**c, "name": f"{name}: {c['name'].replace('; true here by construction', '')}"})
    part.metrics[f"text_{source}"] = {LABELS[m]: round(float(np.mean(v["accuracy"])), 4) for m, v in acc.items()}
    part.metrics[f"text_{source}"]["oracle"] = round(float(oracle.mean()), 4)
    part.notes.append(table(name, acc, cfg.methods, oracle))
    part.notes.append(f"{name}: {cfg.users} labelers x {cfg.n_train} train / {cfg.n_test} test pairs, rho {cfg.rho}, "
                      f"eta {cfg.tail}, beta set for oracle accuracy {cfg.oracle_accuracy}; {cfg.backbone} with LoRA "
                      f"(r {cfg.rank}, alpha {cfg.alpha}, dropout {cfg.dropout}) on query/key of the top "
                      f"{cfg.lora_blocks} blocks (lower blocks cached), max {cfg.max_length} tokens; Adam lr {cfg.lr}"
                      f"{' linear to 0' if cfg.linear_schedule else ''}, batch {cfg.batch_size}, {cfg.epochs} epochs' "
                      "steps for every method (G: 2/3 global then lr/3; WU: 0.1 global; Share Rep: global phase, "
                      "then per-user LoRA on the top 30% of the 6 blocks at lr/3, per-user heads throughout).")
    bar_plot(run_dir, source, acc, cfg.methods, oracle)


def table(name: str, acc: dict, methods: list[str], oracle: np.ndarray) -> str:
    """Markdown: accuracy and each labeler's accuracy, mean ± std over seeds, one row per method, then the oracle."""
    n = oracle.shape[1]
    lines = [f"{name} comparison (held-out preference accuracy, ties 0.5; mean ± std over {len(oracle)} seeds):", "",
             "| method | accuracy | " + " | ".join(f"labeler {i}" for i in range(n)) + " |",
             "|---|---|" + "---|" * n]
    cell = (lambda v: f"{np.mean(v):.4f} ± {np.std(v):.4f}")
    for m in methods:
        per_user = np.asarray(acc[m]["per_user"])
        lines.append(f"| {LABELS[m]} | {cell(acc[m]['accuracy'])} | "
                     + " | ".join(cell(per_user[:, i]) for i in range(n)) + " |")
    lines.append(f"| oracle | {cell(oracle.mean(1))} | " + " | ".join(cell(oracle[:, i]) for i in range(n)) + " |")
    return "\n".join(lines)


def bar_plot(run_dir: RunDir, source: str, acc: dict, methods: list[str], oracle: np.ndarray) -> None:
    """Per-labeler accuracy bars, one colour per method (mean over seeds, std as error bars), like the paper's
    Fig. 2; the oracle as a black tick per labeler."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = oracle.shape[1]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * n), 4))
    for k, m in enumerate(methods):
        per_user = np.asarray(acc[m]["per_user"])
        ax.bar(np.arange(n) + (k - (len(methods) - 1) / 2) * width, per_user.mean(0), width,
               yerr=per_user.std(0), label=LABELS[m], capsize=2)
    ax.scatter(np.arange(n), oracle.mean(0), marker="_", s=400, color="black", label="oracle", zorder=3)
    ax.set_xticks(np.arange(n), [f"labeler {i}" for i in range(n)])
    lowest = min(float(np.mean(acc[m]["per_user"], 0).min()) for m in methods)
    ax.set_ylim(min(0.4, lowest - 0.05), 1.0)
    ax.set_ylabel("held-out preference accuracy")
    ax.set_title(f"{SOURCE_NAMES[source]}: accuracy per labeler")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    fig.savefig(run_dir.path / "plots" / f"text_{source}_per_labeler.png", dpi=110)
    plt.close(fig)
