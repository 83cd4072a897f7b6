"""The meta-learned reward model on a language-model policy (spec §3.1-3.3, §3.6): Algorithm 1 (meta-training),
Algorithm 2 (meta-test) and the policy-preference accuracy A_PL (Eq. 26), for a policy adapted on its LM head only,
over cached trunk states (`policy.head`). The reward model is a linear value head on frozen sentence features
(MiniLM), r_φ(x, y) = z(x, y)·w + b, φ = [w, b]; a fixed table of rewards (a fitted BT model, the judge) is the
same objective with φ = [rewards of every cached response]."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from collabalign.methods.meta_reward.bilevel import (
    InnerObjective,
    OuterLoss,
    Params,
    hypergradient,
    inner_loop,
    pl_loss,
    reward_weights,
)
from collabalign.policy.head import HeadAdapter, HeadCache

Reward = Callable[[Params, Tensor], Tensor]  # (φ, rows) -> r (n,)


@dataclass
class Pairs:
    """Preference pairs as rows of the cache: chosen[i] is preferred to rejected[i] for the same prompt."""

    chosen: Tensor
    rejected: Tensor

    def __len__(self) -> int:
        return len(self.chosen)

    def sample(self, n: int, gen: torch.Generator) -> Pairs:
        idx = torch.randperm(len(self), generator=gen)[:n]
        return Pairs(self.chosen[idx], self.rejected[idx])


@dataclass
class Domain:
    """One domain of the task: its fine-tuning rows (D^T, no labels) and its preference pairs, cut into the pairs
    training may use, the validation pairs model selection uses, and all of them (what a held-out domain is scored
    on)."""

    name: str
    rows: Tensor
    train: Pairs
    validation: Pairs
    pairs: Pairs


@dataclass
class TextTask:
    """Every cached response of every domain, their reward features (N, F) and the domains by name."""

    head: HeadAdapter
    features: Tensor
    domains: dict[str, Domain] = field(default_factory=dict)

    @property
    def cache(self) -> HeadCache:
        return self.head.cache


@dataclass(frozen=True)
class MetaConfig:
    """Algorithm 1's settings (the experiment's config holds their defaults and ranges)."""

    beta: float
    alpha: float  # inner SGD step
    inner_steps: int  # D
    outer_steps: int  # K
    inner_batch: int
    outer_batch: int
    outer_lr: float  # Adam on φ
    clip: float  # hypergradient norm clip
    weight_decay: float = 0.0
    select_every: int = 10
    weight_norm: str = "none"

    def __post_init__(self) -> None:
        if not self.beta > 0:
            raise ValueError(f"β must be > 0, got {self.beta}")
        if self.inner_steps < 1:
            raise ValueError(f"D (inner steps) must be >= 1, got {self.inner_steps}")


def linear_reward(task: TextTask) -> Reward:
    """r_φ = z·w + b on the task's features, φ = [w (F,), b ()]."""
    return lambda phi, rows: task.features[rows] @ phi[0] + phi[1]


def table_reward(phi: Params, rows: Tensor) -> Tensor:
    """A fixed reward per cached response, φ = [r (N,)]: the BT model's or the judge's scores."""
    return phi[0][rows]


def zero_linear(task: TextTask) -> list[Tensor]:
    """φ_0 = 0: every weight exp(0) = 1, so the first inner loops are plain SFT steps."""
    return [torch.zeros(task.features.shape[1], dtype=torch.float64), torch.zeros((), dtype=torch.float64)]


def rwr_objective(task: TextTask, reward: Reward, beta: float, weight_decay: float = 0.0,
                  weight_norm: str = "none") -> InnerObjective:
    """F(θ, φ; rows) = mean_i w_i log π_θ(y_i|x_i) - λ/2 ‖θ‖² with w_i = exp(r_φ(x_i, y_i)/β) (Eq. 10-12, ascent
    form), or w_i / mean_batch w with weight_norm "batch" (spec §9.5)."""

    def objective(theta: Params, phi: Params, rows: Tensor) -> Tensor:
        logprobs = task.head.logprobs(theta, rows)
        w = reward_weights(reward(phi, rows), beta, weight_norm).to(logprobs.device, logprobs.dtype)
        value = (w * logprobs).mean()
        return value - 0.5 * weight_decay * sum((t * t).sum() for t in theta) if weight_decay else value

    return objective


def pl_objective(task: TextTask) -> OuterLoss:
    """ℓ_PL(θ) on a batch of pairs (Eq. 7), unnormalised log-probs as in the paper."""

    def outer(theta: Params, pairs: Pairs) -> Tensor:
        logprobs = task.head.logprobs(theta, torch.cat([pairs.chosen, pairs.rejected]))
        n = len(pairs)
        return pl_loss(logprobs[:n], logprobs[n:]).mean()

    return outer


@torch.no_grad()
def preference_accuracy(task: TextTask, theta: Params, pairs: Pairs, batch: int = 64) -> float:
    """A_PL (Eq. 26): the fraction of pairs whose chosen response has the higher length-normalised log-prob."""
    hits = 0
    for start in range(0, len(pairs), batch):
        rows = torch.cat([pairs.chosen[start:start + batch], pairs.rejected[start:start + batch]])
        per_token = task.head.logprobs(theta, rows).cpu() / task.cache.lengths[rows]
        n = len(rows) // 2
        hits += int((per_token[:n] > per_token[n:]).sum())
    return hits / len(pairs)


def batches(rows: Tensor, n: int, size: int, gen: torch.Generator) -> list[Tensor]:
    """n minibatches of `size` rows drawn without replacement within each batch."""
    return [rows[torch.randperm(len(rows), generator=gen)[:size]] for _ in range(n)]


def meta_test(task: TextTask, theta0: Params, reward: Reward, phi: Params, rows: Tensor, beta: float, alpha: float,
              steps: int, batch: int, gen: torch.Generator, weight_decay: float = 0.0,
              weight_norm: str = "none") -> list[Tensor]:
    """Algorithm 2: `steps` SGD steps of reward-weighted MLE on the target domain's rows under a frozen reward."""
    objective = rwr_objective(task, reward, beta, weight_decay, weight_norm)
    return inner_loop(objective, theta0, phi, batches(rows, steps, batch, gen), alpha)[-1]


@dataclass
class MetaResult:
    """The selected φ, the outer step it came from and the per-step log (loss, validation A_PL, ‖g‖, max weight)."""

    phi: list[Tensor]
    step: int
    log: dict[str, list[float]]


def meta_train(task: TextTask, theta0: Params, train_domains: Sequence[str], cfg: MetaConfig,
               gen: torch.Generator, progress: Callable[[int, dict], None] | None = None,
               start: Sequence[Tensor] | None = None) -> MetaResult:
    """Algorithm 1 with model selection (spec §3.6, §9.10): each outer step draws one training domain, runs D inner
    steps from θ_0 and takes a clipped Adam step on φ along the hypergradient; every `select_every` steps φ is
    scored by the mean validation A_PL of D-step policies on every training domain, and the best φ is kept. φ starts
    at `start` (default `zero_linear`: the paper's φ_0 = 0)."""
    reward = linear_reward(task)
    objective = rwr_objective(task, reward, cfg.beta, cfg.weight_decay, cfg.weight_norm)
    outer = pl_objective(task)
    phi = [p.detach().clone().requires_grad_(True) for p in (zero_linear(task) if start is None else start)]
    opt = torch.optim.Adam(phi, lr=cfg.outer_lr)
    log: dict[str, list[float]] = {"loss": [], "grad_norm": [], "max_weight": [], "validation_apl": [],
                                   "validation_step": []}
    best = (-1.0, 0, [p.detach().clone() for p in phi])

    def select(step: int) -> None:
        nonlocal best
        scores = []
        for name in train_domains:
            d = task.domains[name]
            theta = meta_test(task, theta0, reward, phi, d.rows, cfg.beta, cfg.alpha, cfg.inner_steps,
                              cfg.inner_batch, gen, cfg.weight_decay, cfg.weight_norm)
            scores.append(preference_accuracy(task, theta, d.validation))
        score = sum(scores) / len(scores)
        log["validation_apl"].append(score)
        log["validation_step"].append(step)
        if score > best[0]:
            best = (score, step, [p.detach().clone() for p in phi])

    select(0)
    for k in range(cfg.outer_steps):
        d = task.domains[train_domains[int(torch.randint(len(train_domains), (1,), generator=gen))]]
        inner = batches(d.rows, cfg.inner_steps, cfg.inner_batch, gen)
        hg = hypergradient(objective, outer, theta0, phi, inner, d.train.sample(cfg.outer_batch, gen), cfg.alpha)
        norm = float(torch.sqrt(sum((g * g).sum() for g in hg.grad)))
        scale = min(1.0, cfg.clip / norm) if norm > 0 else 1.0
        for p, g in zip(phi, hg.grad, strict=True):
            p.grad = g * scale
        opt.step()
        with torch.no_grad():
            log["max_weight"].append(float(reward_weights(reward(phi, d.rows), cfg.beta).max()))
        log["loss"].append(hg.loss)
        log["grad_norm"].append(norm)
        if (k + 1) % cfg.select_every == 0 or k + 1 == cfg.outer_steps:
            select(k + 1)
        if progress:
            progress(k + 1, {"loss": hg.loss, "best_validation_apl": best[0]})
    return MetaResult([p.detach() for p in best[2]], best[1], log)


def train_steps(loss: Callable[[Params, Tensor], Tensor], theta0: Params, rows: Tensor, steps: int, lr: float,
                batch: int, gen: torch.Generator) -> list[Tensor]:
    """Plain SGD on `loss(θ, rows)` over minibatches of `rows` (SFT, DPO, HPL share it and its learning rate)."""
    theta = [t.detach().clone().requires_grad_(True) for t in theta0]
    for b in batches(rows, steps, batch, gen):
        grads = torch.autograd.grad(loss(theta, b), theta)
        with torch.no_grad():
            for t, g in zip(theta, grads, strict=True):
                t -= lr * g
    return [t.detach() for t in theta]
