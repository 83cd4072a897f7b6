"""The language-model path of the FIRM reproduction: the policy, the prompts split across clients, the held-out
evaluator and one federated run per (arm, seed). `lm.py` declares the claims and composes the arms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from collabalign.data.errors import DataError
from collabalign.data.formats import load_prompts
from collabalign.data.hh_rlhf import topic_of
from collabalign.data.partition import dirichlet, iid
from collabalign.data.safety_prompts import SafetyPrompts, safety_prompts
from collabalign.experiments.firm.common import preference
from collabalign.experiments.firm.config import Config, LMConfig
from collabalign.federation import simulate
from collabalign.methods.firm.federated import (
    ClientData,
    FederatedPPO,
    FederatedRLOO,
    LambdaRule,
    Rollouts,
)
from collabalign.models.backbones import load_backbone
from collabalign.policy import Policy
from collabalign.policy.model import lora_targets
from collabalign.seeding import Seeds


@dataclass(frozen=True)
class Arm:
    """One configuration the paper compares: its λ rule, client count, prompt split and reward models."""

    name: str
    rule: LambdaRule
    clients: int
    split: str = "iid"  # iid | dirichlet
    hetero: bool = False  # half the clients score helpfulness with the third, differently trained model


def arms(cfg: LMConfig) -> list[Arm]:
    """Every arm the config switches on; the base arm "firm" (β, C, iid, same RMs) comes first."""
    out = [Arm("firm", LambdaRule("firm", beta=cfg.beta), cfg.clients)]
    if cfg.rq1:
        out += [Arm("fedcmoo-a", LambdaRule("server", beta=0.0), cfg.clients),
                Arm("fedavg-ls", LambdaRule("fixed", w=(0.5, 0.5)), cfg.clients)]
    out += [Arm(f"beta={b:g}/C={cfg.beta_clients}", LambdaRule("firm", beta=b), cfg.beta_clients)
            for b in cfg.beta_sweep]
    out += [Arm(f"p1/p2={r:g}", LambdaRule("firm", p=preference(r)), cfg.clients) for r in cfg.preferences]
    if cfg.ablations:
        out += [Arm("hetero-rm", LambdaRule("firm", beta=cfg.beta), cfg.clients, hetero=True),
                Arm(f"dirichlet={cfg.dirichlet_alpha:g}", LambdaRule("firm", beta=cfg.beta), cfg.clients,
                    split="dirichlet"),
                Arm(f"C={2 * cfg.clients}", LambdaRule("firm", beta=cfg.beta), 2 * cfg.clients)]
    if cfg.only is not None:
        unknown = set(cfg.only) - {a.name for a in out}
        if unknown:
            raise ValueError(f"lm.only names arms the config does not switch on: {sorted(unknown)}")
        out = [a for a in out if a.name in cfg.only]
    return out


def lm_prompts(cfg: LMConfig, data_root: Path | None, count_tokens: Callable[[str], int],
               rng: np.random.Generator) -> SafetyPrompts:
    """The train and held-out prompts: the prompts JSONL of `cfg.data`, else HH-RLHF's and PKU-SafeRLHF's under
    `data_root`."""
    if cfg.data is None:
        return safety_prompts(data_root, cfg.prompts_per_source, cfg.eval_prompts, count_tokens, cfg.max_prompt_tokens,
                              rng)
    return jsonl_prompts(Path(cfg.data.path), cfg.eval_prompts, count_tokens, cfg.max_prompt_tokens, rng)


def jsonl_prompts(path: Path, n_eval: int, count_tokens: Callable[[str], int], max_tokens: int,
                  rng: np.random.Generator) -> SafetyPrompts:
    """Every prompt of the file that fits in `max_tokens` (the longer ones left out, never cut), `n_eval` of them
    held out for evaluation, each with its keyword topic (the label of Dirichlet splits)."""
    prompts = load_prompts(path)
    fits = [p for p in prompts if count_tokens(p) <= max_tokens]
    if len(fits) <= n_eval:
        raise DataError(path, None, "prompt", f"{len(fits)} of {len(prompts)} prompts fit in lm.max_prompt_tokens = "
                        f"{max_tokens}: more than lm.eval_prompts = {n_eval} are needed")
    order = rng.permutation(len(fits))
    train = [fits[i] for i in order[n_eval:]]
    return SafetyPrompts(train, [topic_of(p) for p in train], [fits[i] for i in order[:n_eval]],
                         len(prompts) - len(fits))


class LMRunner:
    """Builds the policy once and runs arms over seeds; every run starts from the same base model."""

    def __init__(self, config: Config, rewards, seeds: Seeds, data_root: Path | None):
        self.cfg, self.engine, self.rewards, self.seeds = config.lm, config.engine, rewards, seeds
        cfg = config.lm
        backbone = load_backbone(cfg.model)
        lora = cfg.lora
        self.policy = Policy(backbone, targets=tuple(lora_targets(backbone, lora)), rank=lora.rank, alpha=lora.alpha,
                             dropout=lora.dropout, objectives=2, generator=seeds.torch("firm/lm/lora")).to(cfg.device)
        self.rollouts = Rollouts(cfg.batches, cfg.batch_size, cfg.max_new_tokens,
                                 max_prompt_tokens=cfg.max_prompt_tokens)
        self.prompts = lm_prompts(cfg, data_root, self.prompt_tokens, seeds.numpy("firm/lm/prompts"))
        self.base_evals: dict[int, dict] = {}  # LoRA starts at B = 0 and the eval stream depends on the round only

    def evaluate(self, policy: Policy, round_: int) -> dict[str, float]:
        """Mean helpful and harmless reward of the global model on the fixed held-out prompts; the sampling stream
        depends on the round only, so every arm and seed is scored on the same draws of the generator."""
        if round_ == 0 and 0 in self.base_evals:  # round 0 is the base model for every arm and seed
            return self.base_evals[0]
        prompts = [p for p in self.prompts.eval for _ in range(self.cfg.eval_samples)]
        rollout = policy.generate(prompts, self.cfg.max_new_tokens, generator=Seeds(0).torch("firm/eval", round_),
                                  max_prompt_tokens=self.cfg.max_prompt_tokens)
        lengths = rollout.response_mask.sum(1)
        out = {"eval_helpful": float(np.mean(self.rewards.helpful(prompts, rollout.responses))),
               "eval_harmless": float(np.mean(self.rewards.harmless(prompts, rollout.responses))),
               "eval_length": float(lengths.float().mean()),
               "eval_capped": float((lengths == self.cfg.max_new_tokens).float().mean())}
        if round_ == 0:
            self.base_evals[0] = out
        return out

    def base_on(self, round_: int) -> dict[str, float]:
        """The base model (adapters off) scored on round `round_`'s evaluation stream, computed once."""
        if round_ not in self.base_evals:
            with self.policy.reference():
                self.base_evals[round_] = self.evaluate(self.policy, round_)
        return self.base_evals[round_]

    def client_data(self, arm: Arm, seed: int) -> dict[str, ClientData]:
        """The train prompts split across the arm's clients (iid or Dirichlet over topics), with their RMs."""
        rng = self.seeds.numpy(f"firm/lm/split/{arm.split}/{arm.clients}", seed)
        train = self.prompts.train
        parts = (iid(len(train), arm.clients, rng) if arm.split == "iid"
                 else dirichlet(self.prompts.train_topics, arm.clients, self.cfg.dirichlet_alpha, rng, min_size=2))
        out = {}
        for c, part in enumerate(parts):
            helpful = self.rewards.helpful_alt if arm.hetero and c >= arm.clients // 2 else self.rewards.helpful
            out[f"client{c:02d}"] = ClientData([train[i] for i in part], (helpful, self.rewards.harmless))
        return out

    def run(self, arm: Arm, seed: int, progress: bool) -> tuple[list[dict], object]:
        """One federated run of `arm` from the base model; returns its per-round metrics and the ledger."""
        cfg = self.cfg
        algorithm = (FederatedPPO(self.policy, arm.rule, cfg.ppo, self.rollouts, self.evaluate) if cfg.step == "ppo"
                     else FederatedRLOO(self.policy, arm.rule, cfg.ppo, self.rollouts, cfg.replies_per_prompt,
                                                  self.evaluate))
        per = algorithm.engine_rounds_per_round
        result = simulate(algorithm, self.client_data(arm, seed), self.cfg.rounds * per, seed=seed, eval_every=per,
                          options=self.engine, progress=progress, label=f"{arm.name} seed {seed}")
        records = [{**m, "round": m["round"] // per} for m in result.metrics]
        return records, result.ledger

    def prompt_tokens(self, prompt: str) -> int:
        """Tokens of a prompt as the policy sees it (chat template included)."""
        return int(self.policy.encode([prompt], max_prompt_tokens=10**6)[0].shape[1])

    def samples(self, generator_seed: int = 0) -> list[str]:
        """Greedy-ish answers (temperature 0.7, fixed stream) of the current policy to the fixed sample prompts."""
        gen = torch.Generator().manual_seed(generator_seed)
        return self.policy.generate(self.cfg.samples, self.cfg.max_new_tokens, temperature=0.7, generator=gen,
                                    max_prompt_tokens=10**6).responses
