"""The meta-learned reward model, the entry point: preference pairs in domains, one held out; Algorithm 1 meta-learns
one reward model over the other domains, Algorithm 2 adapts the policy to the held-out domain under it.

    from collabalign.methods.meta_reward import MetaRewardConfig, train_meta_reward
    result = train_meta_reward(MetaRewardConfig(held_out="kitchen"), "pairs.jsonl")   # rows need `domain`
    result.save("runs/meta")        # adapters/global: PEFT folder on the encoder + head.safetensors
    SavedScorer("runs/meta")(prompts, replies)                                         # the meta-learned reward

The reward is a linear head on the frozen encoder's pooled last hidden state of the (prompt, reply) text pair (the
mean over tokens of an encoder, the last real token of a causal LM: how `SavedScorer` pools), standardised over
every reply of the file; the standardisation is folded into the saved head. The method trains no encoder LoRA: the
saved adapter is rank 1 with B = 0 (the bare encoder), there so the reward loads through `PeftModel`. The policy is
adapted on its LM head only, over cached trunk states (`policy.head`), as in the sentiment experiment.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from collabalign.artifacts import Result
from collabalign.baselines import bt_probe, compare, probe_hits
from collabalign.config import ConfigError, LoRASection, Strict, short
from collabalign.data.amazon_reviews import split_pairs
from collabalign.data.formats import pairs_and_hash
from collabalign.data.preferences import PreferencePair, PreferenceSet
from collabalign.lora.inject import inject_lora
from collabalign.lora.targets import default_targets
from collabalign.methods.meta_reward.baselines import sft
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
from collabalign.models.backbones import Backbone
from collabalign.models.pooled import PooledModel, tokenize
from collabalign.models.reward import pair_correct
from collabalign.models.reward import preference_accuracy as reward_accuracy
from collabalign.models.saved import base_prefix, own_backbone, pooled_adapter
from collabalign.models.text_reward import standardiser
from collabalign.policy import Policy
from collabalign.policy.head import HeadAdapter, cache_responses
from collabalign.seeding import Seeds


class MetaRewardConfig(Strict):
    """Algorithm 1 (meta-training over every domain but `held_out`) and Algorithm 2 (meta-test on `held_out`)."""

    held_out: str  # the test domain: its pairs are never trained on, only scored
    model: str = "minilm-l6"  # the reward model's frozen encoder
    policy: str = "smollm2-135m"  # the causal LM whose LM head the inner loop adapts
    lora: LoRASection = LoRASection(rank=8, alpha=16.0)  # the policy's LM-head adapter
    beta: PositiveFloat = 1.0  # β: RWR weights exp(r / β)
    lr: PositiveFloat = 3e-3  # α: every SGD step on the policy (SFT, inner loop, meta-test)
    weight_norm: Literal["none", "batch"] = "batch"  # weights as they are, or over their batch mean
    batch: PositiveInt = 8  # inner and SFT minibatch
    sft_steps: NonNegativeInt = 100  # SFT on every domain's replies before meta-training (0: none)
    inner_steps: PositiveInt = 5  # D
    outer_steps: PositiveInt = 30  # K
    outer_batch: PositiveInt = 16  # pairs per hypergradient
    outer_lr: PositiveFloat = 0.05  # Adam on the reward head φ
    clip: PositiveFloat = 1.0  # hypergradient norm clip
    select_every: PositiveInt = 10  # model selection on the training domains' validation pairs
    validation_fraction: float = Field(0.2, gt=0, lt=1)  # of each training domain's pairs
    test_steps: PositiveInt = 50  # Algorithm 2's steps on the held-out domain
    start: Literal["bradley-terry", "zero"] = "bradley-terry"  # φ_0: a BT fit on the training pairs, or the paper's 0
    max_length: PositiveInt = 128  # encoder tokens per (prompt, reply)
    seed: NonNegativeInt = 0

    @model_validator(mode="after")
    def _head_only(self) -> MetaRewardConfig:
        if self.lora.targets not in (None, ["lm_head"]) or self.lora.blocks is not None or self.lora.dropout:
            raise ValueError("the policy is adapted on its LM head only: lora.targets, lora.blocks and lora.dropout "
                             "cannot be set")
        return self


@torch.no_grad()
def pooled_features(pooled: PooledModel, tokenizer, prompts: Sequence[str], replies: Sequence[str],
                    max_length: int, batch_size: int = 32) -> np.ndarray:
    """The encoder's pooled last hidden state of each (prompt, reply), as `SavedScorer` computes it (float64)."""
    out = []
    for start in range(0, len(prompts), batch_size):
        tokens = tokenize(tokenizer, prompts[start:start + batch_size], max_length,
                          replies[start:start + batch_size])
        hidden = pooled.backbone(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask).last_hidden_state
        out.append(pooled.pool(hidden, tokens.attention_mask).double().numpy())
    return np.concatenate(out)


@torch.no_grad()
def fold_head(reward: PooledModel, w: np.ndarray, b: float, mean: np.ndarray, scale: np.ndarray) -> None:
    """Sets the reward's head to r = ((z - mean) / scale) . w + b on the raw pooled features z, so the saved model
    (encoder + head, no standardiser) gives exactly the reward the method trained."""
    reward.head.weight.copy_(torch.as_tensor(w / scale)[None])
    reward.head.bias.fill_(b - float((mean / scale) @ w))


def _domains(pairs: list[PreferencePair], held_out: str, index: dict[tuple[str, str], int],
             config: MetaRewardConfig) -> dict[str, Domain]:
    """Each domain's replies (fine-tuning rows, no labels) and pairs; a training domain's pairs cut into train and
    validation (seeded), the held-out domain's kept whole for scoring."""
    names = list(dict.fromkeys(p.attributes["domain"] for p in pairs))
    if held_out not in names:
        raise ConfigError(f"held_out = {short(held_out)}: not a domain in the data; its domains are {names[:20]}")
    if len(names) < 2:
        raise ConfigError(f"need a domain to train on besides the held-out {held_out!r}; the data has only it")

    def rows(part: list[PreferencePair]) -> Pairs:
        return Pairs(torch.tensor([index[(p.prompt, p.chosen)] for p in part], dtype=torch.long),
                     torch.tensor([index[(p.prompt, p.rejected)] for p in part], dtype=torch.long))

    out, empty = {}, rows([])
    for name in names:
        mine = [p for p in pairs if p.attributes["domain"] == name]
        replies = torch.tensor(sorted({index[(p.prompt, y)] for p in mine for y in (p.chosen, p.rejected)}))
        if name == held_out:
            out[name] = Domain(name, replies, empty, empty, rows(mine))
            continue
        train, validation = split_pairs(mine, [1 - config.validation_fraction, config.validation_fraction],
                                        Seeds(config.seed).numpy("meta_reward/pairs", name))
        if not train or not validation:
            raise ValueError(f"domain {name!r} has {len(mine)} pairs: too few to keep a validation fraction of "
                             f"{config.validation_fraction} and train on the rest")
        out[name] = Domain(name, replies, rows(train), rows(validation), rows(mine))
    return out


def _accuracy(rewards: np.ndarray, pairs: Pairs) -> float:
    """The fraction of pairs whose chosen reply gets the higher reward (a tie counts half, as everywhere)."""
    r = torch.as_tensor(rewards)
    return reward_accuracy(r[pairs.chosen], r[pairs.rejected])


def bt_start(task: TextTask, train: list[str], seeds: Seeds) -> list[torch.Tensor]:
    """φ_0 = a Bradley-Terry reward on the task's features fitted on the training domains' training pairs (never
    their validation pairs, which choose the outer step): meta-training then starts from the supervised reward, and
    model selection keeping step 0 keeps that reward, not the zero one."""
    z = task.features.numpy()
    chosen = torch.cat([task.domains[d].train.chosen for d in train]).numpy()
    rejected = torch.cat([task.domains[d].train.rejected for d in train]).numpy()
    head = bt_probe(z[chosen], z[rejected], seeds.numpy("meta_reward/start"))
    w = head.weight / head.scale
    return [torch.as_tensor(w, dtype=torch.float64), torch.as_tensor(-float(head.mean @ w), dtype=torch.float64)]


def other_domains_probe(features: np.ndarray, rewards: np.ndarray, train: list[Pairs], held_out: Pairs, name: str,
                        seeds: Seeds) -> dict:
    """The meta-learned reward against a Bradley-Terry probe on the same frozen features trained on every pair of the
    training domains, both scored on the held-out domain's pairs (`baselines.compare`)."""
    chosen, rejected = torch.cat([p.chosen for p in train]).numpy(), torch.cat([p.rejected for p in train]).numpy()
    head = bt_probe(features[chosen], features[rejected], seeds.numpy("baseline-probe"))
    probe = probe_hits(head, features[held_out.chosen.numpy()], features[held_out.rejected.numpy()])
    r = torch.as_tensor(rewards)
    ours = pair_correct(r[held_out.chosen], r[held_out.rejected]).numpy()
    return compare("held-out domain accuracy", ours, probe,
                   f"a Bradley-Terry probe on frozen {name} features trained on the other domains")


def train_meta_reward(config: MetaRewardConfig, data: str | Path | PreferenceSet, model: Backbone | str | None = None,
                      policy: Backbone | str | None = None, progress: bool = False) -> Result:
    """Meta-learns the reward (`result.adapters["global"]`) on every domain but `config.held_out`; metrics hold its
    pairwise accuracy per domain, the policies' held-out A_PL (Eq. 26) and Algorithm 1's log; arrays hold the
    held-out domain's Algorithm-2 policy head (`held_out_policy.lm_head.lora_A` (r, H) and `lora_B` (V, r))."""
    pairs, data_hash = pairs_and_hash(data, require=("domain",))
    seeds = Seeds(config.seed)
    texts = list(dict.fromkeys((p.prompt, y) for p in pairs for y in (p.chosen, p.rejected)))
    index = {t: i for i, t in enumerate(texts)}
    domains = _domains(list(pairs), config.held_out, index, config)
    encoder, name = own_backbone(model, config.model, ("max_length", config.max_length))
    reward = PooledModel(encoder.model, encoder.causal, 1, seeds.torch("meta_reward/head"))
    inject_lora(reward.backbone, default_targets(encoder.model), 1, generator=seeds.torch("meta_reward/encoder"))
    raw = pooled_features(reward, encoder.tokenizer, [p for p, _ in texts], [y for _, y in texts], config.max_length)
    mean, scale = standardiser(raw)
    lm, _ = own_backbone(policy, config.policy)
    actor = Policy(lm, targets=("lm_head",), rank=config.lora.rank, alpha=config.lora.alpha, dropout=0.0,
                   generator=seeds.torch("meta_reward/lora"))
    if progress:
        print(f"meta-reward: caching trunk states of {len(texts)} replies", flush=True)
    cache = cache_responses(actor, [p for p, _ in texts], [y for _, y in texts])
    task = TextTask(HeadAdapter(actor, cache), torch.as_tensor((raw - mean) / scale), domains)
    train = [d for d in domains if d != config.held_out]
    theta0 = task.head.params()
    all_rows = torch.cat([d.rows for d in domains.values()])
    theta = (sft(task, theta0, all_rows, config.sft_steps, config.lr, config.batch, seeds.torch("meta_reward/sft"))
             if config.sft_steps else theta0)
    meta = MetaConfig(config.beta, config.lr, config.inner_steps, config.outer_steps, config.batch,
                      config.outer_batch, config.outer_lr, config.clip, select_every=config.select_every,
                      weight_norm=config.weight_norm)
    say = (lambda k, m: print(f"meta-reward step {k}/{config.outer_steps}: {m}", flush=True)) if progress else None
    start = bt_start(task, train, seeds) if config.start == "bradley-terry" else None
    meta_result = meta_train(task, theta, train, meta, seeds.torch("meta_reward/meta"), say, start)
    w, b = meta_result.phi
    target = domains[config.held_out]
    adapted = meta_test(task, theta, linear_reward(task), meta_result.phi, target.rows, config.beta, config.lr,
                        config.test_steps, config.batch, seeds.torch("meta_reward/test"),
                        weight_norm=config.weight_norm)
    with torch.no_grad():
        rewards = (task.features @ w + b).numpy()
    fold_head(reward, w.numpy(), float(b), mean, scale)
    task.head.load(adapted)
    layer = task.head.layer
    arrays = {"held_out_policy.lm_head.lora_A": layer.A.detach().float().numpy().copy(),
              "held_out_policy.lm_head.lora_B": layer.B.detach().float().numpy().copy()}
    metrics = {"held_out": config.held_out, "train_domains": train,
               "pairs": {d: len(domains[d].pairs) for d in domains},
               "held_out_reward_accuracy": _accuracy(rewards, target.pairs),
               "reward_accuracy": {d: _accuracy(rewards, domains[d].pairs) for d in domains},
               "held_out_apl": {"sft": preference_accuracy(task, theta, target.pairs),
                                "meta_test": preference_accuracy(task, adapted, target.pairs)},
               "selected_step": meta_result.step, "log": meta_result.log,
               "baseline": other_domains_probe(raw, rewards, [domains[d].pairs for d in train], target.pairs, name,
                                               seeds)}
    if meta_result.step == 0:
        metrics["note"] = (f"model selection kept the initial reward (outer step 0: {config.start}): meta-training "
                           "never raised the training domains' validation A_PL")
    adapter = pooled_adapter(reward, base_prefix(encoder.model), name)
    return Result("meta-reward", "reward", name, config.model_dump(), data_hash, metrics, {"global": adapter},
                  arrays=arrays, max_length=config.max_length, model=reward)
