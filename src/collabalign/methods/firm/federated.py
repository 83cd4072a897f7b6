"""FIRM and its baselines on a language-model policy (spec §3.1, §3.2, §3.5), as one federation `Algorithm`
(`FederatedRLOO`: the same with REINFORCE-leave-one-out local steps instead of PPO).

Every client runs K rollout batches of PPO per round on its own prompts with M reward models; the methods differ
only in how the M per-objective PPO gradients are combined at each minibatch step (`LambdaRule`):
- FIRM: each client solves its own regularised MGDA (β, or a preference vector p) at every step; the server
  averages adapters only, so a client uploads d floats;
- FedAvg-LS: fixed weights w, no solve;
- FedCMOO-A: a gradient phase (every client uploads its M per-objective gradients at θ_t, M·d floats; the server
  solves one β = 0 MGDA on their average) then a training phase with that λ for every client, so one training
  round is two engine rounds.
Adam states, value heads and the KL controller are private client state (spec §3.1 "Not communicated").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from collabalign.comm import Message
from collabalign.federation.aggregation import weighted_average
from collabalign.federation.engine import ReplySpec
from collabalign.federation.protocol import ClientContext
from collabalign.methods.firm.solver import solve
from collabalign.policy import (
    AdaptiveKL,
    Policy,
    PPOConfig,
    objective_gradients,
    optimizers,
    ppo_losses,
    ppo_update,
    prepare,
    rloo_advantages,
    write_gradient,
)
from collabalign.policy.state import load_optimizer, save_optimizer
from collabalign.seeding import Seeds


@dataclass(frozen=True)
class LambdaRule:
    """How a client combines its M objectives: "firm" (local solve with beta or preference p), "fixed" (weights w,
    FedAvg-LS), or "server" (FedCMOO-A: one server-solved λ per round)."""

    kind: str
    beta: float = 0.01
    p: tuple[float, ...] | None = None
    w: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("firm", "fixed", "server"):
            raise ValueError(f"lambda rule must be firm, fixed or server, got {self.kind!r}")
        if self.kind == "fixed" and self.w is None:
            raise ValueError("a fixed lambda rule needs weights w")


@dataclass(frozen=True)
class ClientData:
    """A client's prompts and its M reward models (callables (prompts, responses) -> rewards in [0, 1])."""

    prompts: list[str]
    rewards: tuple


@dataclass(frozen=True)
class Rollouts:
    """Per round: K batches of B prompts, responses of at most `max_new_tokens`, sampled at `temperature`."""

    batches: int = 3
    batch_size: int = 16
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    max_prompt_tokens: int = 256


def firm_weights(beta: float, p: tuple[float, ...] | None):
    """The per-step weight callable of FIRM: λ = argmin over the simplex of λᵀ(Ĝ + D)λ for the gradients G (d, M)."""

    def weights(grads: torch.Tensor) -> torch.Tensor:
        g = grads.double()
        return torch.as_tensor(solve((g.T @ g).numpy(), beta=beta, p=p, normalize=True), dtype=grads.dtype)

    return weights


class FederatedPPO:
    """One federation Algorithm for FIRM, FedAvg-LS and FedCMOO-A on a shared in-process `Policy`."""

    def __init__(self, policy: Policy, rule: LambdaRule, ppo: PPOConfig, rollouts: Rollouts, evaluate_fn=None):
        self.policy, self.rule, self.ppo, self.rollouts = policy, rule, ppo, rollouts
        self.evaluate_fn = evaluate_fn

    @property
    def engine_rounds_per_round(self) -> int:
        """FedCMOO-A's training round is a gradient phase plus a training phase."""
        return 2 if self.rule.kind == "server" else 1

    def init(self, seeds: Seeds) -> dict:
        self.policy.reset_adapters(seeds.torch("firm/lora-init"))
        return {"params": self.policy.adapter_state(), "lambda": None}

    def configure(self, state: dict, round_: int, client_ids: list[str]) -> dict[str, Message]:
        if self.rule.kind == "server" and round_ % 2 == 0:  # training phase: only λ goes down
            msg = Message({"lambda": state["lambda"].astype(np.float32)}, {"round": round_, "phase": "train"})
        else:
            msg = Message(state["params"], {"round": round_, "phase": "grad" if self.rule.kind == "server" else ""})
        return {cid: msg for cid in client_ids}

    def client_update(self, message: Message, client: ClientContext) -> Message:
        phase = message.meta.get("phase", "")
        if phase == "grad":  # keep θ_t (private state is a flat dict of arrays) for the training phase
            client.state.update({f"theta.{k}": v.copy() for k, v in message.items()})
            return self._gradient_phase(message, client)
        if phase == "train":
            kept = [k for k in client.state if k.startswith("theta.")]
            params = {k.removeprefix("theta."): client.state.pop(k) for k in kept}
            weights = torch.as_tensor(message["lambda"])
        else:
            params = dict(message)
            weights = (firm_weights(self.rule.beta, self.rule.p) if self.rule.kind == "firm"
                       else torch.tensor(self.rule.w, dtype=torch.float32))
        return self._train(params, client, weights)

    def _batch(self, client: ClientContext):
        """One rollout on B of the client's prompts, scored by its M reward models -> (rollout, rewards (B, M))."""
        data: ClientData = client.data
        r = self.rollouts
        idx = client.rng.choice(len(data.prompts), size=r.batch_size, replace=len(data.prompts) < r.batch_size)
        prompts = [data.prompts[i] for i in idx]
        rollout = self.policy.generate(prompts, r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       generator=client.torch_rng, max_prompt_tokens=r.max_prompt_tokens)
        rewards = np.stack([np.asarray(rm(prompts, rollout.responses), dtype=np.float32) for rm in data.rewards], 1)
        return rollout, torch.as_tensor(rewards)

    def _gradient_phase(self, message: Message, client: ClientContext) -> Message:
        """FedCMOO-A's first pass: the M per-objective PPO gradients on one fresh batch at θ_t (uploaded whole)."""
        self.policy.load_adapter_state(dict(message))
        self._restore_value_heads(client)
        kl = AdaptiveKL.from_state(client.state, self.ppo)
        rollout, rewards = self._batch(client)
        batch = prepare(self.policy, rollout, rewards, kl.value, self.ppo)
        losses, _, _ = ppo_losses(self.policy, batch, torch.arange(len(rollout.prompts)), self.ppo)
        grads = objective_gradients(losses, self.policy.adapter_params())
        return Message({"grads": grads.numpy().astype(np.float32)}, {"n": len(rollout.prompts)})

    def _train(self, params: dict, client: ClientContext, weights) -> Message:
        """K rollout batches of PPO from `params` with the given combination; logs λ and rewards privately."""
        self.policy.load_adapter_state(params)
        actor, critic = self._restore(client)
        kl = AdaptiveKL.from_state(client.state, self.ppo)
        lambdas, rewards_log = [], []
        for _ in range(self.rollouts.batches):
            rollout, rewards = self._batch(client)
            batch = prepare(self.policy, rollout, rewards, kl.value, self.ppo)
            stats = ppo_update(self.policy, actor, critic, batch, self.ppo, client.torch_rng, weights)
            kl.update(stats["kl"], len(rollout.prompts))
            lambdas += stats["lambdas"]
            rewards_log.append(rewards.mean(0).numpy())
        self._save(client, actor, critic, kl)
        client.state["lambda_log"] = np.asarray(lambdas, dtype=np.float64)
        client.state["reward_log"] = np.asarray(rewards_log, dtype=np.float64)
        n = self.rollouts.batches * self.rollouts.batch_size
        return Message(self.policy.adapter_state(), {"n": n})

    def _restore(self, client: ClientContext):
        """The client's persistent actor and critic Adam states and value heads (fresh on its first round)."""
        actor, critic = optimizers(self.policy, self.ppo)
        if self._restore_value_heads(client):
            load_optimizer(actor, client.state, "actor")
            load_optimizer(critic, client.state, "critic")
        return actor, critic

    def _restore_value_heads(self, client: ClientContext) -> bool:
        """The client's value heads (zero on its first round); True when it had saved ones."""
        if "value.weight" not in client.state:
            self.policy.reset_value_heads()
            return False
        self.policy.load_value_state(client.state)
        return True

    def _save(self, client: ClientContext, actor, critic, kl: AdaptiveKL) -> None:
        client.state.update(self.policy.value_state())
        client.state.update(save_optimizer(actor, "actor"))
        client.state.update(save_optimizer(critic, "critic"))
        client.state.update(kl.state())

    def reply_spec(self, state: dict, message: Message, cid: str) -> ReplySpec:
        """Gradient phase: the P x M objective gradients (M is the client's number of reward models); otherwise the
        trained adapters, measured from the round's θ_t."""
        params = state["params"]
        if message.meta.get("phase") == "grad":
            return ReplySpec({"grads": ((sum(v.size for v in params.values()), -1), "<f4")})
        return ReplySpec({k: (v.shape, v.dtype.str) for k, v in params.items()}, dict(params))

    def aggregate(self, state: dict, replies: dict[str, Message], round_: int) -> dict:
        ordered = [replies[cid] for cid in sorted(replies)]
        if "grads" in ordered[0]:  # FedCMOO-A gradient phase: one exact β = 0 MGDA on the averaged gradients
            mean = np.mean([r["grads"].astype(np.float64) for r in ordered], axis=0)
            lam = solve(mean.T @ mean, beta=0.0, p=None, normalize=True)
            return {"params": state["params"], "lambda": np.asarray(lam)}
        return {"params": weighted_average(ordered, np.array([r.meta["n"] for r in ordered])),
                "lambda": state["lambda"]}

    def evaluate(self, state: dict, clients: dict[str, ClientContext], round_: int) -> dict:
        """Held-out rewards of the global model (when an evaluator is set) and this round's λ statistics."""
        out: dict = {}
        if self.rule.kind == "server" and round_ % 2 == 1:
            return out  # gradient phase: nothing trained yet
        if self.evaluate_fn is not None:  # by training round, so every rule is scored on the same draws
            self.policy.load_adapter_state(state["params"])
            out.update(self.evaluate_fn(self.policy, round_ // self.engine_rounds_per_round))
        logs = [c.state["lambda_log"] for c in clients.values() if "lambda_log" in c.state]
        if round_ > 0 and logs and all(len(x) == len(logs[0]) for x in logs):
            out.update(lambda_stats(np.stack(logs)))
            rewards = np.stack([c.state["reward_log"] for c in clients.values()])  # (C, K, M)
            out.update({f"train_reward_{j}": float(rewards[..., j].mean()) for j in range(rewards.shape[-1])})
        if round_ > 0 and clients and all("kl_log" in c.state for c in clients.values()):  # RLOO's sequence KL
            out["train_kl"] = float(np.mean([c.state["kl_log"].mean() for c in clients.values()]))
            out["kl_coef"] = float(np.mean([c.state["kl_coef"] for c in clients.values()]))
        return out


def lambda_stats(lams: np.ndarray) -> dict:
    """λ logs (C, steps, M) -> mean λ per objective, across-client dispersion D_λ (mean over steps of
    (1/C) Σ_c ‖λ^c − λ̄‖²) and volatility (mean |Δλ_1| between consecutive steps), and every client's λ_1 per step."""
    mean = lams.mean(0)  # (steps, M)
    disp = ((lams - mean) ** 2).sum(-1).mean()
    vol = np.abs(np.diff(lams[..., 0], axis=1)).mean() if lams.shape[1] > 1 else 0.0
    out = {f"lambda_{j}": float(mean[:, j].mean()) for j in range(lams.shape[-1])}
    out.update({"lambda_dispersion": float(disp), "lambda_volatility": float(vol),
                "lambda_steps": lams[..., 0].tolist()})  # per client, per step: the λ trajectories' plot
    return out


class FederatedRLOO(FederatedPPO):
    """FIRM (or FedAvg-LS) with a REINFORCE-leave-one-out local step instead of PPO: per batch, `samples` replies per
    prompt, one RLOO loss per objective on the KL-shaped rewards, combined by the client's λ rule."""

    def __init__(self, policy: Policy, rule: LambdaRule, ppo: PPOConfig, rollouts: Rollouts, samples: int,
                 evaluate_fn=None):
        if samples < 2:
            raise ValueError(f"RLOO needs at least 2 samples per prompt, got {samples}")
        super().__init__(policy, rule, ppo, rollouts, evaluate_fn)
        self.samples = samples

    def _batch(self, client: ClientContext):
        """B of the client's prompts, each sampled `samples` times in a row, scored -> (rollout, rewards (B·k, M))."""
        data: ClientData = client.data
        r = self.rollouts
        idx = client.rng.choice(len(data.prompts), size=r.batch_size, replace=len(data.prompts) < r.batch_size)
        prompts = [data.prompts[i] for i in idx for _ in range(self.samples)]
        rollout = self.policy.generate(prompts, r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       generator=client.torch_rng, max_prompt_tokens=r.max_prompt_tokens)
        rewards = np.stack([np.asarray(rm(prompts, rollout.responses), dtype=np.float32) for rm in data.rewards], 1)
        return rollout, torch.as_tensor(rewards)

    def _losses(self, client: ClientContext, kl: AdaptiveKL):
        """One batch's M RLOO losses on the KL-shaped rewards -> (losses (M,), rewards (B·k, M), mean sequence KL)."""
        rollout, rewards = self._batch(client)
        logprobs = self.policy.token_logprobs(rollout).sum(1)
        seq_kl = logprobs.detach() - self.policy.token_logprobs(rollout, reference=True).sum(1)
        shaped = rewards.to(logprobs) - kl.value * seq_kl[:, None]
        losses = -(rloo_advantages(shaped, self.samples) * logprobs[:, None]).mean(0)
        return losses, rewards, float(seq_kl.mean())

    def _gradient_phase(self, message: Message, client: ClientContext) -> Message:
        """FedCMOO-A's first pass: the M per-objective RLOO gradients on one fresh batch at θ_t (uploaded whole)."""
        self.policy.load_adapter_state(dict(message))
        losses, rewards, _ = self._losses(client, AdaptiveKL.from_state(client.state, self.ppo))
        grads = objective_gradients(losses, self.policy.adapter_params())
        return Message({"grads": grads.numpy().astype(np.float32)}, {"n": len(rewards)})

    def _train(self, params: dict, client: ClientContext, weights) -> Message:
        """K RLOO steps from `params`; one λ per step (from the M objective gradients when the rule solves)."""
        self.policy.load_adapter_state(params)
        actor, critic = self._restore(client)
        kl = AdaptiveKL.from_state(client.state, self.ppo)
        trained = self.policy.adapter_params()
        lambdas, rewards_log, kls, n = [], [], [], 0
        for _ in range(self.rollouts.batches):
            losses, rewards, seq_kl = self._losses(client, kl)
            grads = objective_gradients(losses, trained)
            lam = (weights(grads) if callable(weights) else weights).detach().to(grads)
            actor.zero_grad(set_to_none=True)
            write_gradient(trained, grads @ lam)
            actor.step()
            kl.update(seq_kl, len(rewards))
            lambdas.append(lam.numpy().astype(np.float64))
            rewards_log.append(rewards.mean(0).numpy())
            kls.append(seq_kl)
            n += len(rewards)
        self._save(client, actor, critic, kl)
        client.state["lambda_log"] = np.asarray(lambdas, dtype=np.float64)
        client.state["reward_log"] = np.asarray(rewards_log, dtype=np.float64)
        client.state["kl_log"] = np.asarray(kls, dtype=np.float64)
        return Message(self.policy.adapter_state(), {"n": n})
