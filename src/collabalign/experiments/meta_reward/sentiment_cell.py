"""One cell of the sentiment task, (held-out domain, seed): every method's policy, its held-out A_PL, its
training-domain validation A_PL (the tuned-β protocol's only input), then judge rewards and win rates of the policies
the protocols pick."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from collabalign.experiments.meta_reward.sentiment_config import BETA_METHODS, SentimentConfig
from collabalign.experiments.meta_reward.sentiment_setup import Setup, fold_domains, union
from collabalign.methods.meta_reward import baselines
from collabalign.methods.meta_reward.bilevel import Params
from collabalign.methods.meta_reward.text import (
    Domain,
    MetaConfig,
    Pairs,
    Reward,
    TextTask,
    linear_reward,
    meta_test,
    meta_train,
    preference_accuracy,
)
from collabalign.models.sentiment_judge import SentimentJudge
from collabalign.models.text_reward import LinearHead
from collabalign.policy import PPOConfig
from collabalign.seeding import Seeds


@dataclass
class Fold:
    """What every method of one cell reads: the task with this held-out domain's pairs cut, its training domains,
    the held-out domain, the judge and θ_SFT."""

    setup: Setup
    held_out: str
    seeds: Seeds
    task: TextTask
    train: list[str]
    target: Domain
    train_pairs: Pairs
    judge: SentimentJudge
    theta_sft: list[Tensor]
    progress: bool

    @property
    def cfg(self) -> SentimentConfig:
        """The part's config."""
        return self.setup.cfg

    def gen(self, purpose: str) -> torch.Generator:
        """A generator for one purpose of this cell (common random numbers across methods)."""
        return self.seeds.torch(f"meta_reward/{self.held_out}/{purpose}")

    def say(self, text: str) -> None:
        """A progress line, when progress is on."""
        if self.progress:
            print(f"meta-reward [{self.held_out} seed {self.seeds.seed}] {text}", flush=True)


@dataclass
class Trained:
    """Policies by key (method or method@β), their training-domain validation A_PL, and a log per key."""

    policies: dict[str, list[Tensor]] = field(default_factory=dict)
    validation: dict[str, float] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)

    def add(self, other: Trained) -> None:
        """Takes in another method family's policies, validation and log."""
        self.policies |= other.policies
        self.validation |= other.validation
        self.log |= other.log


def key(method: str, beta: float | None) -> str:
    """A policy's key: the method, at β when it has one."""
    return method if beta is None else f"{method}@{beta:g}"


def meta_config(cfg: SentimentConfig, beta: float, alpha: float) -> MetaConfig:
    """Algorithm 1's settings from the part's config, at one β and the chosen step size α."""
    return MetaConfig(beta=beta, alpha=alpha, inner_steps=cfg.inner_steps, outer_steps=cfg.outer_steps,
                      inner_batch=cfg.batch, outer_batch=cfg.outer_batch, outer_lr=cfg.outer_lr, clip=cfg.clip,
                      select_every=cfg.select_every, weight_norm=cfg.weight_norm)


def make_fold(setup: Setup, held_out: str, seed: int, progress: bool) -> Fold:
    """The cell's task and θ_SFT: SFT on every domain's fine-tuning rows."""
    cfg, seeds = setup.cfg, Seeds(seed)
    task = TextTask(setup.task.head, setup.task.features, fold_domains(setup, held_out, seeds))
    train = [d for d in (cfg.train_domains or cfg.domains) if d != held_out]
    all_rows = torch.cat([task.domains[d].rows for d in cfg.domains])
    theta_sft = baselines.sft(task, task.head.params(), all_rows, cfg.sft_steps, setup.lr, cfg.batch,
                              seeds.torch("meta_reward/sft"))
    return Fold(setup, held_out, seeds, task, train, task.domains[held_out],
                union([task.domains[d].train for d in train]), setup.judges[held_out], theta_sft, progress)


def validate_rwr(fold: Fold, reward: Reward, phi: Params, beta: float) -> float:
    """Mean A_PL on the training domains' validation pairs of D-step Algorithm-2 policies fitted on each of them (the
    regime meta-training selects φ in)."""
    cfg, scores = fold.cfg, []
    for d in fold.train:
        dom = fold.task.domains[d]
        theta = meta_test(fold.task, fold.theta_sft, reward, phi, dom.rows, beta, fold.setup.lr, cfg.inner_steps,
                          cfg.batch, fold.gen(f"validate/{d}"), weight_norm=cfg.weight_norm)
        scores.append(preference_accuracy(fold.task, theta, dom.validation))
    return float(np.mean(scores))


def validate_policy(fold: Fold, theta: list[Tensor]) -> float:
    """Mean A_PL of a policy on the training domains' validation pairs."""
    return float(np.mean([preference_accuracy(fold.task, theta, fold.task.domains[d].validation) for d in fold.train]))


def ours(fold: Fold) -> Trained:
    """Algorithm 1 at every β of the grid, then Algorithm 2 on the held-out domain (converged and matched)."""
    cfg, lr, out, reward = fold.cfg, fold.setup.lr, Trained(), linear_reward(fold.task)
    for beta in sorted(set(cfg.beta_grid)):
        result = meta_train(fold.task, fold.theta_sft, fold.train, meta_config(cfg, beta, lr),
                            fold.gen(f"meta/{beta:g}"))
        phi = result.phi
        for name, steps in (("ours", cfg.test_steps), ("ours-matched", cfg.inner_steps)):
            out.policies[key(name, beta)] = meta_test(fold.task, fold.theta_sft, reward, phi, fold.target.rows, beta,
                                                      lr, steps, cfg.batch, fold.gen("test"),
                                                      weight_norm=cfg.weight_norm)
        out.validation[key("ours", beta)] = validate_rwr(fold, reward, phi, beta)
        out.log[key("ours", beta)] = {"selected_step": result.step, "phi_norm": float(phi[0].norm()),
                                      "phi_bias": float(phi[1]), "loss": result.log["loss"],
                                      "validation_apl": result.log["validation_apl"],
                                      "max_weight": result.log["max_weight"][-1]}
        fold.say(f"ours β={beta:g}: validation A_PL {out.validation[key('ours', beta)]:.3f}")
    return out


def reward_baselines(fold: Fold, bt_table: Tensor) -> Trained:
    """BT+RWR (Algorithm 2 under the BT reward table) and the oracle (under the judge) at every β of the grid."""
    cfg, lr, out = fold.cfg, fold.setup.lr, Trained()
    judged = fold.judge.score([r for _, r in fold.setup.texts])
    for beta in sorted(set(cfg.beta_grid)):
        out.policies[key("bt+rwr", beta)] = baselines.bt_rwr(
            fold.task, fold.theta_sft, bt_table, fold.target.rows, beta, lr, cfg.test_steps, cfg.batch,
            fold.gen("test"), cfg.weight_norm)
        out.validation[key("bt+rwr", beta)] = validate_rwr(fold, lambda phi, rows: phi[0][rows], [bt_table], beta)
        out.policies[key("oracle", beta)] = baselines.oracle(
            fold.task, fold.theta_sft, judged, fold.target.rows, beta, lr, cfg.test_steps, cfg.batch,
            fold.gen("test"), cfg.weight_norm)
    return out


def pair_baselines(fold: Fold) -> Trained:
    """HPL and DPO (every β of the grid) on the training domains' pairs."""
    cfg, lr, out = fold.cfg, fold.setup.lr, Trained()
    out.policies["hpl"] = baselines.hpl(fold.task, fold.theta_sft, fold.train_pairs, cfg.pair_steps, lr, cfg.batch,
                                        fold.gen("hpl"))
    out.validation["hpl"] = validate_policy(fold, out.policies["hpl"])
    for beta in sorted(set(cfg.beta_grid)):
        theta = baselines.dpo(fold.task, fold.theta_sft, fold.train_pairs, beta, cfg.pair_steps, lr, cfg.batch,
                              fold.gen("dpo"))
        out.policies[key("dpo", beta)] = theta
        out.validation[key("dpo", beta)] = validate_policy(fold, theta)
    return out


def ppo_baselines(fold: Fold, bt_head: LinearHead) -> Trained:
    """PPO(TR) and PPO(TR+TE) on the BT reward model of generated text, at every β of the grid."""
    cfg, setup, out = fold.cfg, fold.setup, Trained()
    mean, scale = setup.feature_stats

    def text_reward(prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        return bt_head.logit((setup.encoder(list(responses)) - mean) / scale)

    train_prompts = sorted({setup.texts[i][0] for d in fold.train for i in fold.task.domains[d].rows.tolist()})
    target_prompts = sorted({setup.texts[i][0] for i in fold.target.rows.tolist()})
    ppo_cfg = PPOConfig(minibatch=max(1, cfg.ppo_batch // 2), epochs=2, actor_lr=cfg.ppo_lr, critic_lr=cfg.ppo_lr,
                        advantage="sequence")
    for name, prompts in (("ppo(tr)", train_prompts), ("ppo(tr+te)", train_prompts + target_prompts)):
        for beta in sorted(set(cfg.beta_grid)):
            trace: list[dict] = []
            theta = baselines.ppo(fold.task.head, fold.theta_sft, prompts, text_reward, beta, cfg.ppo_iterations,
                                  cfg.ppo_batch, cfg.max_new_tokens, ppo_cfg, fold.gen(f"{name}/{beta:g}"), trace)
            out.policies[key(name, beta)] = theta
            out.validation[key(name, beta)] = validate_policy(fold, theta)
            out.log[key(name, beta)] = trace
        fold.say(f"{name} done")
    return out


def tuned(cfg: SentimentConfig, validation: dict[str, float]) -> dict[str, str]:
    """Each β-method's policy at the β of the grid with the best training-domain validation A_PL (the oracle has no
    validation: its judge exists for the held-out domain only, so it stays at the shared β)."""
    out = {"oracle": key("oracle", cfg.beta)}
    for m in BETA_METHODS:
        if m != "oracle":
            out[m] = max((key(m, b) for b in cfg.beta_grid), key=lambda k: validation[k])
    return out


SAMPLES = 3  # generations per policy kept in its cell (lowest temperature, first held-out prompts) for the report


@torch.no_grad()
def judge_policy(fold: Fold, theta: list[Tensor]) -> dict[str, Any]:
    """Judge P(positive) of the policy's generations for the held-out prompts at every temperature (common random
    numbers across methods), and the win rate against each prompt's preferred reference response. A diverged policy
    (a non-finite weight: it cannot sample) scores the judge's floor, 0, and wins nothing: a failure counts against
    its method, never for it."""
    cfg, head, texts = fold.cfg, fold.task.head, fold.setup.texts
    if not finite(theta):
        n = cfg.eval_prompts * cfg.repetitions
        return {f"{t:g}": {"scores": [0.0] * n, "win": 0.0} for t in cfg.temperatures}
    by_prompt: dict[str, int] = {}
    for row in fold.target.pairs.chosen.tolist():
        by_prompt.setdefault(texts[row][0], row)
    order = fold.seeds.numpy(f"meta_reward/{fold.held_out}/eval").permutation(len(by_prompt))
    picked = [list(by_prompt)[j] for j in order[:cfg.eval_prompts]]
    reference = fold.judge.score([texts[by_prompt[p]][1] for p in picked])
    head.load(theta)
    per_temp = len(picked) * cfg.repetitions
    temps = torch.tensor(cfg.temperatures, dtype=torch.float32).repeat_interleave(per_temp)
    rollout = head.policy.generate(picked * (cfg.repetitions * len(cfg.temperatures)), cfg.max_new_tokens,
                                   generator=fold.gen("judge"), temperature=temps)
    scores = fold.judge.score(rollout.responses)
    out: dict[str, Any] = {}
    for i, temp in enumerate(cfg.temperatures):
        s = scores[i * per_temp:(i + 1) * per_temp]
        out[f"{temp:g}"] = {"scores": s.tolist(), "win": float(np.mean(s > np.tile(reference, cfg.repetitions)))}
    low = int(np.argmin(cfg.temperatures))  # what the report shows: the first prompts' generations at the lowest T
    out[f"{cfg.temperatures[low]:g}"]["samples"] = [
        {"prompt": picked[k], "response": rollout.responses[low * per_temp + k],
         "judge": round(float(scores[low * per_temp + k]), 3)} for k in range(min(SAMPLES, len(picked)))]
    return out


def run_cell(setup: Setup, held_out: str, seed: int, progress: bool) -> dict[str, Any]:
    """Every method of one (held-out domain, seed) cell, their held-out A_PL, validation, β choices and judge scores."""
    cfg, clock = setup.cfg, Stopwatch()
    theta0 = setup.task.head.params()
    fold = clock("sft", make_fold, setup, held_out, seed, progress)
    trained = Trained({"sft": fold.theta_sft})
    trained.add(clock("ours", ours, fold))
    bt_head, bt_table = baselines.bt_rewards(fold.task, fold.train_pairs, cfg.bt_c)
    trained.log["bt_norm"] = float(np.linalg.norm(bt_head.weight))
    trained.add(clock("reward baselines", reward_baselines, fold, bt_table))
    trained.add(clock("pair baselines", pair_baselines, fold))
    trained.add(clock("ppo baselines", ppo_baselines, fold, bt_head))
    diverged = sorted(k for k, theta in trained.policies.items() if not finite(theta))
    apl = {k: 0.0 if k in diverged else preference_accuracy(fold.task, theta, fold.target.pairs)
           for k, theta in trained.policies.items()}  # a diverged policy ranks no pair right
    choices = tuned(cfg, trained.validation)
    evaluated = {"sft", "hpl", *(key(m, cfg.beta) for m in BETA_METHODS), *choices.values()}
    judge = clock("judge", lambda: {k: judge_policy(fold, trained.policies[k]) for k in sorted(evaluated)})
    setup.task.head.load(theta0)
    return {"held_out": held_out, "seed": seed, "apl": apl, "validation": trained.validation, "tuned": choices,
            "judge": judge, "judge_accuracy": fold.judge.accuracy, "log": trained.log, "diverged": diverged,
            "pairs": {"held_out": len(fold.target.pairs), "train": len(fold.train_pairs)},
            "stage_seconds": clock.seconds}


def finite(theta: list[Tensor]) -> bool:
    """Whether every weight of a policy is finite (else it diverged)."""
    return all(bool(torch.isfinite(t).all()) for t in theta)


class Stopwatch:
    """Seconds spent per named stage of a cell (the cost table of the report)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def __call__(self, stage: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.seconds[stage] = round(time.perf_counter() - start, 1)
        return out
