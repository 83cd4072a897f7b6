"""The sentiment task of the meta-reward reproduction (paper §5.1 at CPU scale): Amazon reviews in four domains,
a SmolLM2 policy adapted on its LM head, a linear reward head on MiniLM features, a TF-IDF judge per held-out
domain; one cell = (held-out domain, seed) runs every method and is cached as JSON in the run directory, so a long
main run continues where it stopped. `sentiment.py` declares the claims and decides them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from collabalign import runs
from collabalign.config import Grid, Strict
from collabalign.data.amazon_reviews import AMAZON_DIR, DOMAINS, load_domain, load_task, split_pairs
from collabalign.methods.meta_reward import baselines
from collabalign.methods.meta_reward.text import (
    Domain,
    MetaConfig,
    Pairs,
    TextTask,
    linear_reward,
    meta_test,
    meta_train,
    preference_accuracy,
)
from collabalign.models.backbones import load_backbone
from collabalign.models.sentiment_judge import SentimentJudge
from collabalign.models.text_reward import SentenceEncoder, check_readable, standardiser
from collabalign.policy import Policy, PPOConfig
from collabalign.policy.head import HeadAdapter, HeadCache, cache_responses
from collabalign.seeding import Seeds

Beta = Annotated[float, Field(gt=0)]
BETA_METHODS = ("ours", "bt+rwr", "ppo(tr)", "ppo(tr+te)", "dpo", "oracle")  # methods with a β (KL coefficient)
METHODS = ("sft", "ours", "bt+rwr", "ppo(tr)", "ppo(tr+te)", "dpo", "hpl", "oracle")


class SentimentConfig(Strict):
    """CPU-scale defaults; the main and GPU configs set their own sizes."""

    run: bool = True
    data_dir: str | None = None  # the shared data folder; default ../shared/data or $COLLABALIGN_DATA
    model: str = "tiny-llama"  # smollm2-135m on CPU; any causal LM name on a GPU
    device: str = "cpu"
    encoder: str = "minilm-l6"  # the reward models' frozen sentence encoder
    domains: Grid[str] = list(DOMAINS)
    held_out: Grid[str] = list(DOMAINS)  # leave-one-domain-out over these
    train_domains: list[str] | None = None  # default: every domain but the held-out one
    seeds: int = Field(5, ge=1)
    opening_words: int = Field(2, ge=1)
    response_words: int = Field(20, ge=5)
    max_examples: int | None = Field(None, ge=1)  # fine-tuning examples per domain (pair reviews always kept)
    max_pairs: int | None = Field(None, ge=4)  # pairs per domain, a seeded subset (small runs)
    validation_fraction: float = Field(0.2, gt=0, lt=1)  # of each training domain's pairs, for model selection
    rank: int = Field(8, ge=1)
    lora_alpha: float = Field(16.0, gt=0)
    lr_grid: Grid[Annotated[float, Field(gt=0)]] = [1e-3, 3e-3, 1e-2]  # α of every SGD stage on the policy (SFT,
    # inner loop, meta-test, DPO, HPL): the one whose SFT has the lowest held-out NLL on unlabelled fine-tuning text
    weight_norm: Literal["none", "batch"] = "batch"  # RWR weights exp(r/β) as they are, or over their batch mean
    batch: int = Field(8, ge=1)  # B_in, and the minibatch of SFT, DPO and HPL
    sft_steps: int = Field(100, ge=1)
    inner_steps: int = Field(5, ge=1)  # D
    outer_steps: int = Field(30, ge=1)  # K
    outer_batch: int = Field(16, ge=1)
    outer_lr: float = Field(0.05, gt=0)  # Adam on φ
    clip: float = Field(1.0, gt=0)
    select_every: int = Field(10, ge=1)
    test_steps: int = Field(50, ge=1)  # Algorithm 2 "converged" (the "matched" variant runs D steps)
    pair_steps: int = Field(50, ge=1)  # DPO and HPL
    bt_c: float = Field(1.0, gt=0)
    ppo_iterations: int = Field(8, ge=1)
    ppo_batch: int = Field(8, ge=1)
    ppo_lr: float = Field(1e-3, gt=0)
    max_new_tokens: int = Field(28, ge=1)
    beta: Beta = 1.0  # the shared-β protocol
    beta_grid: Grid[Beta] = [0.1, 1.0, 2.0, 4.0, 8.0]  # tuned protocol and the sweep of ours (one grid for all)
    eval_prompts: int = Field(8, ge=1)
    temperatures: Grid[Annotated[float, Field(gt=0)]] = [0.25, 0.5, 0.75, 1.0]
    repetitions: int = Field(3, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SentimentConfig:
        unknown = sorted(set(self.domains + self.held_out) - set(DOMAINS))
        if unknown:
            raise ValueError(f"unknown domains {unknown}; known: {list(DOMAINS)}")
        missing = sorted(set(self.held_out) - set(self.domains))
        if missing:
            raise ValueError(f"held-out domains {missing} are not among the domains {self.domains}")
        if self.train_domains is not None:
            shared = sorted(set(self.train_domains) & set(self.held_out))
            if shared:
                raise ValueError(f"held-out domain(s) {shared} are also training domains: a held-out domain's "
                                 "preference pairs must never be trained on")
            if not set(self.train_domains) <= set(self.domains) or not self.train_domains:
                raise ValueError(f"train_domains {self.train_domains} must be a non-empty subset of {self.domains}")
        if len(self.domains) < 2:
            raise ValueError("need at least two domains: one held out, at least one to train on")
        if self.beta not in self.beta_grid:
            raise ValueError(f"the shared β {self.beta} must be on beta_grid {self.beta_grid}")
        return self


def fingerprint(cfg: SentimentConfig, seed: int) -> str:
    """A hash of every setting that changes a cell's numbers (not which cells run)."""
    settings = {**cfg.model_dump(mode="json", exclude={"run", "held_out", "seeds", "data_dir", "device"}), "seed": seed}
    return runs.fingerprint(settings)


@dataclass
class Setup:
    """Everything the cells share: the cached task, the per-domain data, the judges, the policy."""

    cfg: SentimentConfig
    task: TextTask
    examples: dict[str, Any]
    judges: dict[str, SentimentJudge]
    texts: list[tuple[str, str]]  # (prompt, response) of every cached row
    encoder: SentenceEncoder
    feature_stats: tuple[np.ndarray, np.ndarray]  # mean and scale of the raw features (to score new text)
    counts: dict[str, dict[str, int]]
    lr: float = 0.0  # α, chosen by `choose_lr`
    lr_scores: dict[str, float] | None = None


def build(cfg: SentimentConfig, root: Path, seed: int, cache_dir: Path, progress: bool) -> Setup:
    """Loads the domains, builds the policy (LoRA on the LM head only), caches every response's trunk states
    (once per model and text set, as safetensors under `cache_dir`) and MiniLM features, and fits one judge per
    held-out domain on that domain's labelled reviews."""
    from safetensors.torch import load_file, save_file

    data = load_task(root / AMAZON_DIR, cfg.domains, cfg.opening_words, cfg.response_words, seed, cfg.max_examples,
                     cfg.max_pairs)
    texts = list(dict.fromkeys((e.prompt, e.response) for d in cfg.domains for e in data[d].examples))
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
    judges = {d: SentimentJudge(cfg.opening_words, cfg.response_words, seed=seed).fit(load_domain(root / AMAZON_DIR,
                                                                                                  d))
              for d in cfg.held_out}
    setup = Setup(cfg, task, data, judges, texts, encoder, (mean, scale), {d: data[d].counts for d in cfg.domains})
    setup.lr, setup.lr_scores = choose_lr(cfg, task, Seeds(seed))
    if progress:
        print(f"meta-reward: α = {setup.lr:g} (held-out SFT NLL per token {setup.lr_scores})", flush=True)
    return setup


def choose_lr(cfg: SentimentConfig, task: TextTask, seeds: Seeds) -> tuple[float, dict[str, float]]:
    """α from `lr_grid`: SFT on 90% of the cached responses (unlabelled text every method may fine-tune on), scored
    by NLL per token on the other 10%; a step that diverges scores infinity. No preference label is used."""
    n = len(task.cache)
    order = torch.randperm(n, generator=seeds.torch("meta_reward/lr"))
    held, rows = order[:max(1, n // 10)], order[max(1, n // 10):]
    theta0, scores = task.head.params(), {}
    for lr in cfg.lr_grid:
        theta = baselines.sft(task, theta0, rows, cfg.sft_steps, lr, cfg.batch, seeds.torch("meta_reward/lr/sft"))
        with torch.no_grad():
            nll = float(-task.head.logprobs(theta, held).sum().cpu() / task.cache.lengths[held].sum())
        scores[f"{lr:g}"] = nll if np.isfinite(nll) else float("inf")
    best = min(scores, key=scores.get)
    if not np.isfinite(scores[best]):
        raise ValueError(f"SFT diverged at every learning rate of lr_grid {cfg.lr_grid}; add smaller ones")
    return float(best), scores


def _rows(setup: Setup, pairs: list, index: dict) -> Pairs:
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
            out[d] = Domain(d, rows, empty, empty, _rows(setup, pairs, index))
            continue
        train, validation = split_pairs(pairs, [1 - cfg.validation_fraction, cfg.validation_fraction],
                                        seeds.numpy("meta_reward/pairs", d))
        out[d] = Domain(d, rows, _rows(setup, train, index), _rows(setup, validation, index),
                        _rows(setup, pairs, index))
    return out


def union(pairs: list[Pairs]) -> Pairs:
    return Pairs(torch.cat([p.chosen for p in pairs]), torch.cat([p.rejected for p in pairs]))


def _key(method: str, beta: float | None) -> str:
    return method if beta is None else f"{method}@{beta:g}"


class Cell:
    """One (held-out domain, seed): every method's policy, its held-out A_PL, its training-domain validation A_PL
    (the tuned-β protocol's only input), then judge rewards and win rates of the policies the protocols pick."""

    def __init__(self, setup: Setup, held_out: str, seed: int, progress: bool):
        self.setup, self.cfg, self.held_out, self.progress = setup, setup.cfg, held_out, progress
        self.seeds = Seeds(seed)
        self.task = TextTask(setup.task.head, setup.task.features,
                             fold_domains(setup, held_out, self.seeds))
        self.train = [d for d in (self.cfg.train_domains or self.cfg.domains) if d != held_out]
        self.target = self.task.domains[held_out]
        self.train_pairs = union([self.task.domains[d].train for d in self.train])
        self.judge = setup.judges[held_out]
        self.lr, self.norm = setup.lr, setup.cfg.weight_norm
        self.policies: dict[str, list[torch.Tensor]] = {}
        self.validation: dict[str, float] = {}
        self.log: dict[str, Any] = {}

    def gen(self, purpose: str) -> torch.Generator:
        return self.seeds.torch(f"meta_reward/{self.held_out}/{purpose}")

    def say(self, text: str) -> None:
        if self.progress:
            print(f"meta-reward [{self.held_out} seed {self.seeds.seed}] {text}", flush=True)

    def _validate_rwr(self, reward, phi, beta: float) -> float:
        """Mean A_PL on the training domains' validation pairs of D-step Algorithm-2 policies fitted on each of them
        (the regime meta-training selects φ in)."""
        cfg, scores = self.cfg, []
        for d in self.train:
            dom = self.task.domains[d]
            theta = meta_test(self.task, self.theta_sft, reward, phi, dom.rows, beta, self.lr, cfg.inner_steps,
                              cfg.batch, self.gen(f"validate/{d}"), weight_norm=self.norm)
            scores.append(preference_accuracy(self.task, theta, dom.validation))
        return float(np.mean(scores))

    def _validate_policy(self, theta) -> float:
        return float(np.mean([preference_accuracy(self.task, theta, self.task.domains[d].validation)
                              for d in self.train]))

    def run(self) -> dict[str, Any]:
        cfg, task = self.cfg, self.task
        all_rows = torch.cat([task.domains[d].rows for d in cfg.domains])
        theta0 = task.head.params()
        self.theta_sft = baselines.sft(task, theta0, all_rows, cfg.sft_steps, self.lr, cfg.batch,
                                       self.seeds.torch("meta_reward/sft"))
        self.policies["sft"] = self.theta_sft
        self._ours()
        self._reward_baselines()
        self._pair_baselines()
        self._ppo()
        apl = {k: preference_accuracy(task, theta, self.target.pairs) for k, theta in self.policies.items()}
        tuned = self.tuned()
        evaluated = {"sft", "hpl", *(_key(m, cfg.beta) for m in BETA_METHODS), *tuned.values()}
        judge = {k: self._judge(k) for k in sorted(evaluated)}
        task.head.load(theta0)
        return {"held_out": self.held_out, "seed": self.seeds.seed, "apl": apl, "validation": self.validation,
                "tuned": tuned, "judge": judge, "judge_accuracy": self.judge.accuracy, "log": self.log,
                "pairs": {"held_out": len(self.target.pairs), "train": len(self.train_pairs)}}

    def _ours(self) -> None:
        cfg, reward = self.cfg, linear_reward(self.task)
        for beta in sorted(set(cfg.beta_grid)):
            meta = MetaConfig(beta, self.lr, cfg.inner_steps, cfg.outer_steps, cfg.batch, cfg.outer_batch,
                              cfg.outer_lr, cfg.clip, select_every=cfg.select_every, weight_norm=self.norm)
            result = meta_train(self.task, self.theta_sft, self.train, meta, self.gen(f"meta/{beta:g}"))
            phi = result.phi
            self.policies[_key("ours", beta)] = meta_test(self.task, self.theta_sft, reward, phi, self.target.rows,
                                                          beta, self.lr, cfg.test_steps, cfg.batch,
                                                          self.gen("test"), weight_norm=self.norm)
            self.policies[_key("ours-matched", beta)] = meta_test(self.task, self.theta_sft, reward, phi,
                                                                  self.target.rows, beta, self.lr, cfg.inner_steps,
                                                                  cfg.batch, self.gen("test"), weight_norm=self.norm)
            self.validation[_key("ours", beta)] = self._validate_rwr(reward, phi, beta)
            self.log[_key("ours", beta)] = {"selected_step": result.step, "phi_norm": float(phi[0].norm()),
                                            "phi_bias": float(phi[1]), "loss": result.log["loss"],
                                            "validation_apl": result.log["validation_apl"],
                                            "max_weight": result.log["max_weight"][-1]}
            self.say(f"ours β={beta:g}: validation A_PL {self.validation[_key('ours', beta)]:.3f}")

    def _reward_baselines(self) -> None:
        cfg = self.cfg
        self.bt_head, table = baselines.bt_rewards(self.task, self.train_pairs, cfg.bt_c)
        self.log["bt_norm"] = float(np.linalg.norm(self.bt_head.weight))
        judged = self.judge.score([r for _, r in self.setup.texts])
        for beta in sorted(set(cfg.beta_grid)):
            self.policies[_key("bt+rwr", beta)] = baselines.bt_rwr(
                self.task, self.theta_sft, table, self.target.rows, beta, self.lr, cfg.test_steps, cfg.batch,
                self.gen("test"), self.norm)
            self.validation[_key("bt+rwr", beta)] = self._validate_rwr(lambda phi, rows: phi[0][rows], [table], beta)
            self.policies[_key("oracle", beta)] = baselines.oracle(
                self.task, self.theta_sft, judged, self.target.rows, beta, self.lr, cfg.test_steps, cfg.batch,
                self.gen("test"), self.norm)

    def _pair_baselines(self) -> None:
        cfg = self.cfg
        self.policies["hpl"] = baselines.hpl(self.task, self.theta_sft, self.train_pairs, cfg.pair_steps, self.lr,
                                             cfg.batch, self.gen("hpl"))
        self.validation["hpl"] = self._validate_policy(self.policies["hpl"])
        for beta in sorted(set(cfg.beta_grid)):
            theta = baselines.dpo(self.task, self.theta_sft, self.train_pairs, beta, cfg.pair_steps, self.lr,
                                  cfg.batch, self.gen("dpo"))
            self.policies[_key("dpo", beta)] = theta
            self.validation[_key("dpo", beta)] = self._validate_policy(theta)

    def text_reward(self, prompts, responses) -> np.ndarray:
        """The BT reward model on generated text (what PPO optimises)."""
        z = self.setup.encoder(list(responses))
        mean, scale = self.setup.feature_stats
        return self.bt_head.logit((z - mean) / scale)

    def _ppo(self) -> None:
        cfg = self.cfg
        train_prompts = sorted({self.setup.texts[i][0] for d in self.train for i in self.task.domains[d].rows.tolist()})
        target_prompts = sorted({self.setup.texts[i][0] for i in self.target.rows.tolist()})
        ppo_cfg = PPOConfig(minibatch=max(1, cfg.ppo_batch // 2), epochs=2, actor_lr=cfg.ppo_lr, critic_lr=cfg.ppo_lr,
                            advantage="sequence")
        for name, prompts in (("ppo(tr)", train_prompts), ("ppo(tr+te)", train_prompts + target_prompts)):
            for beta in sorted(set(cfg.beta_grid)):
                trace: list[dict] = []
                theta = baselines.ppo(self.task.head, self.theta_sft, prompts, self.text_reward, beta,
                                      cfg.ppo_iterations, cfg.ppo_batch, cfg.max_new_tokens, ppo_cfg,
                                      self.gen(f"{name}/{beta:g}"), trace)
                self.policies[_key(name, beta)] = theta
                self.validation[_key(name, beta)] = self._validate_policy(theta)
                self.log[_key(name, beta)] = trace
            self.say(f"{name} done")

    def tuned(self) -> dict[str, str]:
        """Each β-method's policy at the β of the grid with the best training-domain validation A_PL (the oracle has
        no validation: its judge exists for the held-out domain only, so it stays at the shared β)."""
        out = {"oracle": _key("oracle", self.cfg.beta)}
        for m in BETA_METHODS:
            if m != "oracle":
                out[m] = max((_key(m, b) for b in self.cfg.beta_grid), key=lambda k: self.validation[k])
        return out

    @torch.no_grad()
    def _judge(self, key: str) -> dict[str, Any]:
        """Judge P(positive) of generations for the held-out prompts at every temperature (common random numbers
        across methods), and the win rate against each prompt's preferred reference response."""
        cfg, head = self.cfg, self.task.head
        chosen = self.target.pairs.chosen.tolist()
        by_prompt = {}
        for row in chosen:
            by_prompt.setdefault(self.setup.texts[row][0], row)
        order = self.seeds.numpy(f"meta_reward/{self.held_out}/eval").permutation(len(by_prompt))
        picked = [list(by_prompt)[j] for j in order[:cfg.eval_prompts]]
        reference = self.judge.score([self.setup.texts[by_prompt[p]][1] for p in picked])
        head.load(self.policies[key])
        per_temp = len(picked) * cfg.repetitions
        temps = torch.tensor(cfg.temperatures, dtype=torch.float32).repeat_interleave(per_temp)
        rollout = head.policy.generate(picked * (cfg.repetitions * len(cfg.temperatures)), cfg.max_new_tokens,
                                       generator=self.gen("judge"), temperature=temps)
        scores = self.judge.score(rollout.responses)
        out: dict[str, Any] = {}
        for i, temp in enumerate(cfg.temperatures):
            s = scores[i * per_temp:(i + 1) * per_temp]
            out[f"{temp:g}"] = {"scores": s.tolist(), "win": float(np.mean(s > np.tile(reference, cfg.repetitions)))}
        return out
