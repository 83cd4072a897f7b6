"""FIRM's reward models, trained here on PKU-SafeRLHF and shown to carry signal before any policy uses them:
harmlessness = P(safe | prompt, reply) from a logistic head on frozen MiniLM features; helpfulness = the
Bradley–Terry candidate chosen by nested CV on `better_response_id`; a differently trained helpfulness model (the
inner-CV runner-up) for the heterogeneous-RM ablation. Each is compared, per held-out fold, with chance, the base
rate (harmlessness) and "the longer reply wins" (helpfulness). `fit_rewards` hands the fitted rewards and the
verdicts to the LM parts; `part` reports them."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import Field

from collabalign.claims import _rounded, confirmed, not_run, superiority
from collabalign.config import Distinct, Strict
from collabalign.data.paths import shared_data_dir
from collabalign.data.pku_saferlhf import PKU_FILE, load_pku_saferlhf
from collabalign.models.text_reward import HFRewardModel, SentenceEncoder, TextReward
from collabalign.models.text_reward_fit import (
    CHANCE,
    FOLDS_PURPOSE,
    HELPFUL_CANDIDATES,
    cv_folds,
    fit_harmless,
    fit_helpful,
)
from collabalign.runs import Part
from collabalign.seeding import Seeds

HARMLESS_MARGIN = 0.05  # smallest effect of interest, in accuracy
HELPFUL_MARGIN = 0.02

HARMLESS_OVER_BASE = superiority(
    "harmlessness reward beats the base rate", "held-out per-reply accuracy of P(safe) > 0.5 above the accuracy of "
    "always predicting the training fold's majority label, paired per fold (folds x repeats)",
    smallest_effect=HARMLESS_MARGIN)
HARMLESS_OVER_CHANCE = superiority(
    "harmlessness reward beats chance", "held-out per-reply accuracy of P(safe) > 0.5 above 0.5, per fold",
    smallest_effect=HARMLESS_MARGIN)
HELPFUL_OVER_CHANCE = superiority(
    "helpfulness reward beats chance", "held-out pairwise accuracy on better_response_id of the nested-CV-selected "
    "helpfulness model above 0.5, per outer fold", smallest_effect=HELPFUL_MARGIN)
HELPFUL_OVER_LENGTH = superiority(
    "helpfulness reward beats length-only", "held-out pairwise accuracy of the nested-CV-selected helpfulness model "
    "above 'the longer reply wins' on the same pairs, paired per outer fold", smallest_effect=HELPFUL_MARGIN)
ALT_OVER_CHANCE = superiority(
    "alternative helpfulness reward beats chance", "held-out pairwise accuracy of the inner-CV runner-up (the "
    "differently trained helpfulness model) above 0.5, per outer fold", smallest_effect=HELPFUL_MARGIN)
ALT_OVER_LENGTH = superiority(
    "alternative helpfulness reward beats length-only", "held-out pairwise accuracy of the inner-CV runner-up above "
    "'the longer reply wins', paired per outer fold", smallest_effect=HELPFUL_MARGIN)
CLAIMS = (HARMLESS_OVER_BASE, HARMLESS_OVER_CHANCE, HELPFUL_OVER_CHANCE, HELPFUL_OVER_LENGTH, ALT_OVER_CHANCE,
          ALT_OVER_LENGTH)


class RewardModelsConfig(Strict):
    run: bool = True
    data_dir: str | None = None  # holds pku-saferlhf/; default: the shared data folder
    folds: int = Field(5, ge=2, le=20)
    repeats: int = Field(2, ge=1, le=20)  # folds x repeats held-out replicates per claim
    inner_folds: int = Field(5, ge=2, le=20)  # the inner CV that picks the helpfulness model
    candidates: Distinct[str] = Field(default_factory=lambda: list(HELPFUL_CANDIDATES), min_length=2)
    max_length: int = Field(256, ge=16, le=512)  # MiniLM word pieces per text (right-truncated)


@dataclass
class Rewards:
    """The fitted rewards for the LM parts, the verdicts behind them and their held-out metrics."""

    helpful: TextReward
    harmless: TextReward
    helpful_alt: TextReward
    metrics: dict[str, Any]
    claims: list[dict[str, Any]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)  # one per outer fold

    @property
    def helpful_beats_baselines(self) -> bool:
        return bool(self.metrics["helpful_beats_baselines"])

    @property
    def label(self) -> str:
        """One line the LM parts print beside their helpfulness results."""
        return self.metrics["helpful_label"]


class HFRewardsConfig(Strict):
    """Reward models loaded by Hugging Face name or local path instead of fitted here (the paper's GPU setup)."""

    helpful: str = "Ray2333/gpt2-large-helpful-reward_model"
    harmless: str = "Ray2333/gpt2-large-harmless-reward_model"
    helpful_alt: str = "OpenAssistant/reward_model_deberta-v3-large-v2"
    device: str = "cpu"


def hf_rewards(cfg: HFRewardsConfig) -> Rewards:
    """The three reward models by name; their accuracy is the publishers', not measured here (the label says so)."""
    load = {k: HFRewardModel(getattr(cfg, k), name=k, device=cfg.device) for k in ("helpful", "harmless",
                                                                                    "helpful_alt")}
    label = (f"reward models loaded by name ({cfg.helpful}, {cfg.harmless}, {cfg.helpful_alt}); their accuracy is "
             "not measured by this run")
    return Rewards(load["helpful"], load["harmless"], load["helpful_alt"],
                   {"helpful_beats_baselines": None, "helpful_label": label, "source": cfg.model_dump()})


def with_relevance(rewards: Rewards) -> Rewards:
    """The same rewards with helpfulness replaced by relevance, (1 + cos(MiniLM(prompt), MiniLM(reply))) / 2: a
    signal a length cap does not saturate; the fitted helpfulness model stays the heterogeneous-RM ablation's."""
    from collabalign.methods.firm.entry import RelevanceReward

    label = ("helpfulness here is relevance, (1 + cos(MiniLM(prompt), MiniLM(reply))) / 2: a proxy for answering "
             "the prompt, not a model trained on helpfulness judgements")
    return replace(rewards, helpful=RelevanceReward(),
                   metrics={**rewards.metrics, "helpful_beats_baselines": False, "helpful_label": label})


def pku_path(cfg: RewardModelsConfig) -> Path:
    """The PKU-SafeRLHF file; FileNotFoundError (one line) when the data folder is absent."""
    root = Path(cfg.data_dir) if cfg.data_dir else shared_data_dir()
    if root is None or not (root / PKU_FILE).is_file():
        raise FileNotFoundError(f"{PKU_FILE} not found under {root or '../shared/data'} (set data_dir or "
                                "$COLLABALIGN_DATA): the FIRM reward models are trained on it")
    return root / PKU_FILE


def _label(beats: bool, nested: float, length: float, chosen: str) -> str:
    if beats:
        return (f"helpfulness reward {chosen}: held-out accuracy {nested:.3f} beats chance and length-only "
                f"({length:.3f})")
    return (f"helpfulness reward {chosen} does NOT beat the length-only baseline (held-out {nested:.3f} vs "
            f"{length:.3f}): its results measure length-like signal, not verified helpfulness")


def fit_rewards(cfg: RewardModelsConfig, seeds: Seeds, progress: bool = False) -> Rewards:
    """Fits the three rewards on PKU-SafeRLHF, measures them on held-out folds and decides the part's claims."""
    rows = load_pku_saferlhf(pku_path(cfg))
    t0 = time.perf_counter()
    encoder = SentenceEncoder(max_length=cfg.max_length)
    if progress:
        print(f"firm rewards: encoding {3 * len(rows)} texts, fitting {len(cfg.candidates)} helpfulness candidates",
              file=sys.stderr)
    harmless = fit_harmless(rows, encoder, seeds, cfg.folds, cfg.repeats)
    helpful = fit_helpful(rows, encoder, seeds, cfg.folds, cfg.repeats, cfg.inner_folds, tuple(cfg.candidates))
    fit_s = time.perf_counter() - t0
    claims = [HARMLESS_OVER_BASE.decide(harmless.accuracy, harmless.base_rate),
              HARMLESS_OVER_CHANCE.decide(harmless.accuracy, CHANCE),
              HELPFUL_OVER_CHANCE.decide(helpful.nested, CHANCE, model=helpful.model.name),
              HELPFUL_OVER_LENGTH.decide(helpful.nested, helpful.length_only, model=helpful.model.name),
              ALT_OVER_CHANCE.decide(helpful.nested_alternative, CHANCE, model=helpful.alternative.name),
              ALT_OVER_LENGTH.decide(helpful.nested_alternative, helpful.length_only, model=helpful.alternative.name)]
    verdict = {c["name"]: confirmed(c) for c in claims}
    beats = verdict[HELPFUL_OVER_CHANCE.name] and verdict[HELPFUL_OVER_LENGTH.name]
    alt_beats = verdict[ALT_OVER_CHANCE.name] and verdict[ALT_OVER_LENGTH.name]
    help_metrics = helpful.metrics()
    metrics = {"rows": len(rows), "replies": 2 * len(rows), "folds": cfg.folds, "repeats": cfg.repeats,
               "harmless": harmless.metrics(), "helpful": help_metrics,
               "harmless_beats_baselines": verdict[HARMLESS_OVER_BASE.name] and verdict[HARMLESS_OVER_CHANCE.name],
               "helpful_beats_baselines": beats, "helpful_alt_beats_baselines": alt_beats,
               "helpful_label": _label(beats, help_metrics["nested_accuracy"]["mean"],
                                       help_metrics["length_only"]["mean"], helpful.model.name),
               "seconds": {"fit": round(fit_s, 2), "score_16": round(_score_time(rows, helpful.model, harmless.model,
                                                                                  helpful.alternative), 4)}}
    records = [{"part": "reward_models", "repeat": f.repeat, "fold": f.fold,
                "harmless_accuracy": harmless.accuracy[i], "harmless_base_rate": harmless.base_rate[i],
                "safer_pair_accuracy": harmless.safer_pair_accuracy[i], "helpful_selected": helpful.selected[i],
                "helpful_accuracy": helpful.nested[i], "helpful_alt": helpful.runner_up[i],
                "helpful_alt_accuracy": helpful.nested_alternative[i], "length_only": helpful.length_only[i],
                **{f"candidate_{c}": v[i] for c, v in helpful.candidates.items()}}
               for i, f in enumerate(cv_folds(len(rows), cfg.folds, cfg.repeats, seeds, FOLDS_PURPOSE))]
    return Rewards(helpful.model, harmless.model, helpful.alternative, _rounded(metrics), claims,
                   _rounded(records))


def _score_time(rows, *models: TextReward) -> float:
    """Seconds to score 16 replies the encoder has not seen, with all three rewards."""
    prompts = [r.prompt for r in rows[:16]]
    replies = [f"{r.response_0} (unseen)" for r in rows[:16]]
    start = time.perf_counter()
    for model in models:
        model(prompts, replies)
    return time.perf_counter() - start


def _table(metrics: dict[str, Any]) -> str:
    """Markdown: every model's held-out accuracy (mean [95% interval] over folds) beside its baselines."""
    def cell(s: dict[str, Any]) -> str:
        return f"{s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}]"

    harm, helpf = metrics["harmless"], metrics["helpful"]
    lines = ["| model | task | held-out accuracy | chance | base rate | length-only |", "|---|---|---|---|---|---|",
             f"| {harm['model']} | is_response_safe (per reply) | {cell(harm['accuracy'])} | 0.5 | "
             f"{cell(harm['base_rate'])} | - |",
             f"| {harm['model']} (pairwise) | safer_response_id | {cell(harm['safer_pair_accuracy'])} | 0.5 | - | "
             f"{cell(harm['safer_length_only'])} |",
             f"| nested-CV selection ({helpf['chosen']}) | better_response_id | {cell(helpf['nested_accuracy'])} | "
             f"0.5 | - | {cell(helpf['length_only'])} |",
             f"| inner-CV runner-up ({helpf['alternative']}) | better_response_id | "
             f"{cell(helpf['alternative_nested_accuracy'])} | 0.5 | - | {cell(helpf['length_only'])} |"]
    lines += [f"| candidate {name} ({c['feature_set']}, C={c['c']:g}) | better_response_id | {cell(c['accuracy'])} | "
              f"0.5 | - | {cell(helpf['length_only'])} |" for name, c in helpf["candidates"].items()]
    return "\n".join(lines)


def part(cfg: RewardModelsConfig, seeds: Seeds, progress: bool) -> tuple[Part, Rewards | None]:
    """The reward-model part: fit, measure on held-out folds, decide the claims (not run when switched off or when
    PKU-SafeRLHF is absent); also returns the fitted rewards for the LM parts (None when not fitted)."""
    if not cfg.run:
        return Part([not_run(c, "rewards.run is false") for c in CLAIMS]), None
    try:
        rewards = fit_rewards(cfg, seeds, progress)
    except FileNotFoundError as err:
        return Part([not_run(c, str(err)) for c in CLAIMS], notes=[f"Reward models not fitted: {err}"]), None
    m = rewards.metrics
    notes = [
        f"Reward models (spec §5, §9.15-16), trained on PKU-SafeRLHF ({m['rows']} rows, {m['replies']} labelled "
        f"replies), {cfg.folds}-fold CV over prompts x {cfg.repeats} repeats; rewards are sigmoid(logit) in [0, 1]. "
        "Harmlessness: logistic P(safe) on frozen all-MiniLM-L6-v2 [e(reply), e(prompt) * e(reply)]. Helpfulness: "
        f"Bradley–Terry heads ({', '.join(cfg.candidates)}), one chosen per outer fold by a {cfg.inner_folds}-fold "
        "inner CV on that fold's training rows only; the final model is the inner-CV winner on all rows and the "
        "heterogeneous-RM alternative its runner-up. Folds share training rows, so the t-intervals over folds are "
        "optimistic.",
        _table(m), f"**Label for the LM parts:** {m['helpful_label']}.",
        f"Fit {m['seconds']['fit']:.1f} s; scoring 16 unseen replies with all three rewards "
        f"{m['seconds']['score_16']:.3f} s."]
    return Part(rewards.claims, rewards.records, {"reward_models": m}, notes), rewards
