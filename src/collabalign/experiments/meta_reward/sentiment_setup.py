"""The sentiment task of the meta-reward reproduction (paper §5.1 at CPU scale): the shared setup of its cells. The
domains' data (Amazon reviews, or the user's preference pairs), a causal-LM policy adapted on its LM head, a linear
reward head on sentence-encoder features, a TF-IDF judge per held-out domain and the policy's step size. Each cell
(`sentiment_cell.py`) is cached as JSON in the run directory under `fingerprint`, so a long main run continues where
it stopped; `sentiment.py` declares the claims and decides them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from collabalign import runs
from collabalign.data.amazon_reviews import DomainData, split_pairs
from collabalign.experiments.meta_reward.sentiment_config import SentimentConfig
from collabalign.experiments.meta_reward.sentiment_data import load_data
from collabalign.methods.meta_reward import baselines
from collabalign.methods.meta_reward.text import Domain, Pairs, TextTask
from collabalign.models.backbones import load_backbone
from collabalign.models.sentiment_judge import SentimentJudge
from collabalign.models.text_reward import SentenceEncoder, check_readable, standardiser
from collabalign.policy import Policy
from collabalign.policy.head import HeadAdapter, HeadCache, cache_responses
from collabalign.seeding import Seeds


@dataclass
class Setup:
    """Everything the cells share: the cached task, the per-domain data, the judges, the policy."""

    cfg: SentimentConfig
    task: TextTask
    examples: dict[str, DomainData]
    judges: dict[str, SentimentJudge]
    texts: list[tuple[str, str]]  # (prompt, response) of every cached row
    encoder: SentenceEncoder
    feature_stats: tuple[np.ndarray, np.ndarray]  # mean and scale of the raw features (to score new text)
    counts: dict[str, dict[str, int]]
    data_hash: str | None = None  # sha256 of a JSONL data file
    lr: float = 0.0  # α, chosen by `choose_lr`
    lr_scores: dict[str, float] | None = None


def fingerprint(setup: Setup, seed: int) -> str:
    """A hash of every setting that changes a cell's numbers (not which cells run); a JSONL file by its sha256."""
    cfg = setup.cfg
    exclude = {"run", "held_out", "seeds", "data_dir", "device", "data"}
    settings = {**cfg.model_dump(mode="json", exclude=exclude), "seed": seed, "lr": setup.lr}  # α as chosen
    if cfg.data.source == "jsonl":
        settings["data"] = {"source": "jsonl", "sha256": setup.data_hash}
    return runs.fingerprint(settings)


def build(cfg: SentimentConfig, root: Path | None, seed: int, cache_dir: Path, progress: bool) -> Setup:
    """Loads the domains and their judges, builds the policy (LoRA on the LM head only), caches every response's
    trunk states (once per model and text set, as safetensors under `cache_dir`) and the encoder's features."""
    from safetensors.torch import load_file, save_file

    data = load_data(cfg, root, seed)
    texts = list(dict.fromkeys((e.prompt, e.response) for d in cfg.domains for e in data.domains[d].examples))
    backbone = load_backbone(cfg.model)
    policy = Policy(backbone, targets=("lm_head",), rank=cfg.rank, alpha=cfg.lora_alpha, dropout=0.0,
                    objectives=1, generator=Seeds(seed).torch("meta_reward/lora")).to(cfg.device)
    encoder = SentenceEncoder(load_backbone(cfg.encoder))
    check_readable(encoder.backbone.tokenizer, [r for _, r in texts[:64]], cfg.encoder)
    key = runs.fingerprint([cfg.model, texts])
    path = cache_dir / f"trunk-{key}.safetensors"
    if path.exists():
        cache = HeadCache(**load_file(path))
    else:
        if progress:
            print(f"meta-reward: caching trunk states of {len(texts)} responses ({cfg.model})", flush=True)
        cache = cache_responses(policy, [p for p, _ in texts], [r for _, r in texts])
        cache_dir.mkdir(parents=True, exist_ok=True)
        save_file({"hidden": cache.hidden.contiguous(), "targets": cache.targets, "mask": cache.mask}, str(path))
    raw = encoder([r for _, r in texts], remember=True)
    mean, scale = standardiser(raw)
    task = TextTask(HeadAdapter(policy, cache), torch.as_tensor((raw - mean) / scale, dtype=torch.float64))
    setup = Setup(cfg, task, data.domains, data.judges, texts, encoder, (mean, scale),
                  {d: data.domains[d].counts for d in cfg.domains}, data.sha256)
    setup.lr, setup.lr_scores = choose_lr(cfg, task, Seeds(seed))
    if progress:
        print(f"meta-reward: α = {setup.lr:g} (held-out SFT NLL per token {setup.lr_scores})", flush=True)
    return setup


def choose_lr(cfg: SentimentConfig, task: TextTask, seeds: Seeds) -> tuple[float, dict[str, float]]:
    """α from `lr_grid`: SFT on 90% of the cached responses (unlabelled text every method may fine-tune on) for as
    many steps as a policy takes in all (SFT, then the longest later stage), scored by NLL per token on the other 10%;
    a step that diverges scores infinity. No preference label is used. (At 100 steps, 3e-3 scored best on kitchen,
    but its NLL rose from there, 4.47 -> 5.06 by step 400, and half the policies trained 300 steps at it diverged;
    at 300 steps 1e-3 scores 4.39 against 4.89.)"""
    n = len(task.cache)
    order = torch.randperm(n, generator=seeds.torch("meta_reward/lr"))
    held, rows = order[:max(1, n // 10)], order[max(1, n // 10):]
    theta0, scores = task.head.params(), {}
    for lr in cfg.lr_grid:
        steps = cfg.sft_steps + max(cfg.test_steps, cfg.pair_steps)
        theta = baselines.sft(task, theta0, rows, steps, lr, cfg.batch, seeds.torch("meta_reward/lr/sft"))
        with torch.no_grad():
            nll = float(-task.head.logprobs(theta, held).sum().cpu() / task.cache.lengths[held].sum())
        scores[f"{lr:g}"] = nll if np.isfinite(nll) else float("inf")
    best = min(scores, key=scores.get)
    if not np.isfinite(scores[best]):
        raise ValueError(f"SFT diverged at every learning rate of lr_grid {cfg.lr_grid}; add smaller ones")
    return float(best), scores


def _rows(pairs: list, index: dict[tuple[str, str], int]) -> Pairs:
    """Pairs as rows of the cache."""
    return Pairs(torch.tensor([index[(p.prompt, p.chosen)] for p in pairs], dtype=torch.long),
                 torch.tensor([index[(p.prompt, p.rejected)] for p in pairs], dtype=torch.long))


def fold_domains(setup: Setup, held_out: str, seeds: Seeds) -> dict[str, Domain]:
    """The task's domains for one held-out domain: training domains' pairs cut into train and validation (seeded),
    the held-out domain's pairs kept whole for scoring only."""
    index = {t: i for i, t in enumerate(setup.texts)}
    cfg, out = setup.cfg, {}
    empty = Pairs(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    for d in cfg.domains:
        data = setup.examples[d]
        rows = torch.tensor([index[(e.prompt, e.response)] for e in data.examples], dtype=torch.long)
        pairs = data.pairs
        if d == held_out:
            out[d] = Domain(d, rows, empty, empty, _rows(pairs, index))
            continue
        train, validation = split_pairs(pairs, [1 - cfg.validation_fraction, cfg.validation_fraction],
                                        seeds.numpy("meta_reward/pairs", d))
        if not train or not validation:
            raise ValueError(f"domain {d!r} has {len(pairs)} pairs: too few to keep a validation fraction of "
                             f"{cfg.validation_fraction} and train on the rest")
        out[d] = Domain(d, rows, _rows(train, index), _rows(validation, index), _rows(pairs, index))
    return out


def union(pairs: list[Pairs]) -> Pairs:
    """The pairs of several domains as one set."""
    return Pairs(torch.cat([p.chosen for p in pairs]), torch.cat([p.rejected for p in pairs]))


