"""FIRM, the entry point: a user's prompts split over clients, any Hugging Face causal LM, M reward functions, one
global LoRA policy back, aligned to all M objectives by each client's regularised MGDA (spec §3.1).

    from collabalign.methods.firm import FIRMConfig, train_firm
    result = train_firm(FIRMConfig(model="smollm2-135m", rounds=4), "prompts.jsonl",
                        rewards=["relevance", my_reward])      # my_reward(prompts, replies) -> floats in [0, 1]
    result.save("runs/firm")          # adapters/policy: a PEFT folder on the causal LM
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from collabalign.artifacts import Adapter, Result
from collabalign.baselines import compare
from collabalign.config import ConfigError, Distinct, LoRASection, Strict
from collabalign.data.errors import DataError, PromptError
from collabalign.data.formats import file_hash, json_hash, load_prompts
from collabalign.data.partition import iid
from collabalign.federation.engine import EngineOptions, SimulationResult
from collabalign.federation.job import FederatedJob
from collabalign.lora.peft_io import peft_adapter
from collabalign.methods.firm.federated import ClientData, FederatedPPO, FederatedRLOO, LambdaRule, Rollouts
from collabalign.models.backbones import Backbone
from collabalign.models.saved import own_backbone
from collabalign.policy import Policy, PPOConfig
from collabalign.policy.model import lora_targets
from collabalign.seeding import Seeds

Reward = str | Callable[[list[str], list[str]], Sequence[float]]
LENGTH_WORDS = 32  # the reply length (words) at which the shipped "length" reward saturates


class FIRMConfig(Strict):
    """Federated multi-objective PPO on LoRA: FIRM's per-client regularised MGDA (or a baseline's λ rule)."""

    model: str = "smollm2-135m"
    lora: LoRASection = LoRASection()
    rewards: Distinct[str] = Field(["relevance", "brevity"], min_length=1)  # SHIPPED names, Hugging Face RMs
    rule: Literal["firm", "fedavg-ls", "fedcmoo-a"] = "firm"  # FIRM, or the paper's baselines
    # REINFORCE leave-one-out (no critic; every rule), or the paper's PPO. The default and `ppo`'s settings are what
    # made the FIRM main form's SmolLM2 part learn (docs/reproductions.md, FIRM): PPO's steps from zero value heads
    # left the policy where it started.
    step: Literal["ppo", "rloo"] = "rloo"
    samples: int = Field(4, ge=2)  # rloo: replies sampled per prompt, each judged against the others' mean
    beta: NonNegativeFloat = 0.01  # the MGDA regulariser β (spec §2)
    preference: list[PositiveFloat] | None = None  # p, one weight per reward: replaces (β/2)I by Diag(1/p)
    clients: PositiveInt = 4  # the prompts are split iid over them
    rounds: PositiveInt = 4
    batches: PositiveInt = 1  # rollout batches per client per round
    batch_size: PositiveInt = 8  # prompts per rollout batch
    max_new_tokens: PositiveInt = 24
    max_prompt_tokens: PositiveInt = 128  # a longer prompt (chat template included) is an error, never cut
    temperature: PositiveFloat = 1.0
    ppo: PPOConfig = PPOConfig(minibatch=4, actor_lr=1e-3, kl_init=0.05, kl_target=2.0, kl_horizon=64)
    test_fraction: float = Field(0.2, ge=0, lt=1)  # prompts held out for the reported rewards
    seed: NonNegativeInt = 0
    engine: EngineOptions = EngineOptions()


def _words(replies: Sequence[str]) -> np.ndarray:
    return np.array([len(r.split()) for r in replies], dtype=np.float64)


def length_reward(prompts: Sequence[str], replies: Sequence[str]) -> np.ndarray:
    """min(words / LENGTH_WORDS, 1): longer replies, up to a point."""
    return np.minimum(_words(replies) / LENGTH_WORDS, 1.0)


def brevity_reward(prompts: Sequence[str], replies: Sequence[str]) -> np.ndarray:
    """1 - length_reward: shorter replies."""
    return 1.0 - length_reward(prompts, replies)


class RelevanceReward:
    """(1 + cos(e(prompt), e(reply))) / 2 with e a frozen all-MiniLM-L6-v2: replies on the prompt's topic."""

    def __init__(self):
        from collabalign.models.text_reward import SentenceEncoder

        self.encoder = SentenceEncoder()

    def __call__(self, prompts: Sequence[str], replies: Sequence[str]) -> np.ndarray:
        cos = (self.encoder(prompts, remember=True) * self.encoder(replies)).sum(1).astype(np.float64)
        return (1.0 + cos) / 2.0


# Rewards shipped with the project that need no training: name -> a factory of the reward function
SHIPPED: dict[str, Callable[[], Callable]] = {"length": lambda: length_reward, "brevity": lambda: brevity_reward,
                                              "relevance": RelevanceReward}


def reward_function(spec: Reward) -> tuple[str, Callable[[list[str], list[str]], np.ndarray]]:
    """(name, f) for a shipped reward's name, a Hugging Face sequence-classification reward model's name or path, or
    a callable; f checks that it gets one finite score per reply."""
    if isinstance(spec, str):
        if spec in SHIPPED:
            name, raw = spec, SHIPPED[spec]()
        else:
            from collabalign.models.backbones import hub_config
            from collabalign.models.text_reward import HFRewardModel

            hub_config(spec, known=list(SHIPPED))  # an unknown name is one line, not the hub's errors
            name, raw = spec, HFRewardModel(spec)
    else:
        name, raw = getattr(spec, "name", None) or getattr(spec, "__name__", type(spec).__name__), spec

    def checked(prompts: list[str], replies: list[str]) -> np.ndarray:
        scores = np.asarray(raw(prompts, replies), dtype=np.float64)
        if scores.shape != (len(replies),) or not np.isfinite(scores).all():
            raise ValueError(f"reward {name}: expected {len(replies)} finite scores, got shape {scores.shape}")
        return scores

    return name, checked


def prompts_and_hash(data: str | Path | Sequence[str]) -> tuple[list[str], str]:
    """A prompts JSONL (loaded and checked) or prompt strings, and the sha256 the manifest records."""
    if isinstance(data, str | Path):
        return load_prompts(data), file_hash(data)
    prompts = list(data)
    if not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError("data: give a prompts JSONL path or a non-empty list of non-blank prompt strings")
    return prompts, json_hash(prompts)


def _check_prompts(policy: Policy, prompts: list[str], limit: int, data: str | Path | Sequence[str]) -> None:
    """Every prompt within `limit` tokens, checked before training; one that is not is a DataError naming it."""
    try:
        policy.encode(prompts, max_prompt_tokens=limit)
    except PromptError as err:
        source = str(data) if isinstance(data, str | Path) else "prompts"
        raise DataError(source, None, "prompt", f"{err} or raise max_prompt_tokens (prompts counted from 0, in "
                        "order)") from None


def lambda_rule(config: FIRMConfig, m: int) -> LambdaRule:
    """The λ rule of `config.rule` for M = m rewards (FedAvg-LS: the preference, normalised, as fixed weights)."""
    if config.preference is not None and len(config.preference) != m:
        raise ConfigError(f"preference has {len(config.preference)} weights but there are {m} rewards")
    p = None if config.preference is None else tuple(config.preference)
    if config.rule == "firm":
        return LambdaRule("firm", beta=config.beta, p=p)
    if config.rule == "fedcmoo-a":
        return LambdaRule("server", beta=0.0)
    w = np.ones(m) if p is None else np.asarray(p)
    return LambdaRule("fixed", w=tuple(float(x) for x in w / w.sum()))


def base_policy_baseline(policy: Policy, prompts: list[str], rewards: dict[str, Callable], config: FIRMConfig,
                         seeds: Seeds) -> dict:
    """The trained policy against the base policy (its adapter off), each answering the held-out prompts once from
    the same generator: the reward per prompt, averaged over the objectives (weighted by `preference` when given),
    compared by `baselines.compare`; each objective's two means beside it."""
    def answers() -> list[str]:
        return policy.generate(prompts, config.max_new_tokens, generator=seeds.torch("firm/baseline"),
                               temperature=config.temperature, max_prompt_tokens=config.max_prompt_tokens).responses

    ours = answers()
    with policy.reference():
        base = answers()
    weights = np.ones(len(rewards)) if config.preference is None else np.asarray(config.preference)
    weights = weights / weights.sum()
    scores = {name: (f(prompts, ours), f(prompts, base)) for name, f in rewards.items()}
    record = compare("reward (mean over objectives)" if config.preference is None else "preference-weighted reward",
                     sum(w * s[0] for w, s in zip(weights, scores.values(), strict=True)),
                     sum(w * s[1] for w, s in zip(weights, scores.values(), strict=True)),
                     "the base policy (no adapter)")
    record["per_objective"] = {name: {"ours": round(float(a.mean()), 6), "baseline": round(float(b.mean()), 6)}
                               for name, (a, b) in scores.items()}
    return record


def train_firm(config: FIRMConfig, data: str | Path | Sequence[str], model: Backbone | str | None = None,
               rewards: Sequence[Reward] | None = None, progress: bool = False) -> Result:
    """Trains the global policy; per-round λ and rewards, and the held-out mean reward per objective (when
    `test_fraction` > 0) are in `result.metrics`, the policy in `result.adapters["policy"]`. `rewards` (else
    `config.rewards`): shipped names, Hugging Face reward model names or paths, or callables
    f(prompts, replies) -> one float per reply, ideally in [0, 1]."""
    return firm_job(config, data, model, rewards).run(progress)


def firm_job(config: FIRMConfig, data: str | Path | Sequence[str], model: Backbone | str | None = None,
             rewards: Sequence[Reward] | None = None) -> FederatedJob:
    """The run `train_firm` simulates, for any engine (its rounds are engine rounds: `engine_rounds_per_round` per
    training round)."""
    prompts, data_hash = prompts_and_hash(data)
    named = [reward_function(r) for r in (config.rewards if rewards is None else rewards)]
    names, functions = [n for n, _ in named], tuple(f for _, f in named)
    rule = lambda_rule(config, len(functions))
    backbone, base_name = own_backbone(model, config.model, ("max_prompt_tokens + max_new_tokens",
                                                              config.max_prompt_tokens + config.max_new_tokens))
    seeds = Seeds(config.seed)
    policy = Policy(backbone, lora_targets(backbone, config.lora), config.lora.rank, config.lora.alpha,
                    config.lora.dropout, objectives=len(functions), generator=seeds.torch("firm/lora"))
    _check_prompts(policy, prompts, config.max_prompt_tokens, data)
    rng = seeds.numpy("firm/split")
    order = rng.permutation(len(prompts))
    n_test = round(config.test_fraction * len(prompts))
    test = [prompts[i] for i in np.sort(order[:n_test])]
    train = [prompts[i] for i in np.sort(order[n_test:])]
    clients = {f"client{c}": ClientData([train[i] for i in part], functions)
               for c, part in enumerate(iid(len(train), config.clients, rng))}
    rollouts = Rollouts(config.batches, config.batch_size, config.max_new_tokens, config.temperature,
                        max_prompt_tokens=config.max_prompt_tokens)

    def evaluate(policy: Policy, round_: int) -> dict[str, float]:
        """Mean reward per objective of the global policy on the held-out prompts (one sample each)."""
        rollout = policy.generate(test, config.max_new_tokens, generator=seeds.torch("firm/eval", round_),
                                  temperature=config.temperature, max_prompt_tokens=config.max_prompt_tokens)
        return {f"eval_reward_{j}": float(np.mean(f(test, rollout.responses))) for j, f in enumerate(functions)}

    evaluate_fn = evaluate if test else None
    algorithm = (FederatedPPO(policy, rule, config.ppo, rollouts, evaluate_fn) if config.step == "ppo"
                 else FederatedRLOO(policy, rule, config.ppo, rollouts, config.samples, evaluate_fn))
    per = algorithm.engine_rounds_per_round

    def finish(sim: SimulationResult) -> Result:
        policy.load_adapter_state(sim.state["params"])
        rounds = [{**m, "round": m["round"] // per} for m in sim.metrics]
        metrics = {"rounds": rounds, "objectives": names, "clients": len(clients), "train_prompts": len(train),
                   "test_prompts": n_test, "bytes": sim.ledger.total()}
        metrics.update({k: v for k, v in rounds[-1].items() if k.startswith("eval_reward_")})
        if test:
            metrics["baseline"] = base_policy_baseline(policy, test, dict(zip(names, functions, strict=True)),
                                                       config, seeds)
        adapter = Adapter(*peft_adapter(policy.model, None, "", base_name, task_type="CAUSAL_LM"))
        used = {**config.model_dump(), "rewards": names}  # the rewards actually used (a callable by its name)
        return Result("firm", "policy", base_name, used, data_hash, metrics, {"policy": adapter},
                      max_length=config.max_prompt_tokens + config.max_new_tokens, model=policy)

    return FederatedJob("firm", algorithm, clients, config.rounds * per, config.seed, config.engine, finish,
                        eval_every=per)
