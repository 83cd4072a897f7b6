"""The bandit's world (spec §8.1): settings, the generator stacked over seeds and domains, and one seed's slice."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor

from collabalign.config import Strict

DTYPE = torch.float64


class BanditSettings(Strict):
    """World sizes and every algorithm's hyperparameters (spec §8.1, §9 item 8)."""

    n_dom: int = Field(4, ge=2)
    block: int = Field(4, ge=1)  # coordinates of each feature block s, q and n: K = 3·block features
    candidates: int = Field(8, ge=2)
    sft_prompts: int = Field(60, ge=1)
    sft_responses: int = Field(3, ge=1)  # several responses per prompt, else the reward cannot matter (§3.4)
    pl_prompts: int = Field(80, ge=1)
    val_prompts: int = Field(40, ge=1)
    test_prompts: int = Field(400, ge=1)
    weight_decay: float = Field(1e-2, ge=0)  # λ on every policy objective
    sft_steps: int = Field(400, ge=0)
    sft_lr: float = Field(0.5, gt=0)
    alpha: float = Field(0.3, gt=0)  # inner SGD step, meta-training and meta-test
    inner_batch: int = Field(32, ge=1)
    inner_steps: int = Field(30, ge=1)  # D
    outer_steps: int = Field(1000, ge=0)  # K
    eta: float = Field(0.3, gt=0)  # outer SGD step
    clip: float = Field(1.0, gt=0)  # per-replicate hypergradient norm clip
    outer_batch: int = Field(32, ge=1)
    eval_every: int = Field(50, ge=1)  # E: model selection of φ on the training domains' validation pairs
    test_steps: int = Field(300, ge=1)  # N_test, the "converged" meta-test
    baseline_steps: int = Field(400, ge=0)
    baseline_lr: float = Field(0.3, gt=0)
    bt_ridge: float = Field(1e-3, ge=0)
    bt_newton_steps: int = Field(30, ge=1)
    reward_bound: float | None = Field(None, gt=0)  # c·tanh(r / c) before exp (spec §9 item 7); None = paper

    @model_validator(mode="after")
    def _batches_fit(self) -> BanditSettings:
        if self.inner_batch > self.sft_prompts * self.sft_responses:
            raise ValueError(f"inner_batch {self.inner_batch} exceeds the {self.sft_prompts * self.sft_responses} "
                             "fine-tuning examples of a domain")
        return self


@dataclass
class FineTuning:
    """𝒟^T per seed and domain: prompts with the features of their V candidates, `per_prompt` responses sampled from
    μ^T per prompt (examples are prompt-major: example e belongs to prompt e // per_prompt) and their counts."""

    F: Tensor  # (S, N, P, V, K)
    response: Tensor  # (S, N, E) long
    fex: Tensor  # (S, N, E, K) features of each example's response
    counts: Tensor  # (S, N, P, V) how often each candidate was sampled
    per_prompt: int


@dataclass
class PairSet:
    """Preference pairs labelled by Bradley-Terry with r*; `valid` is 0 where the two samples tied (dropped)."""

    F: Tensor  # (S, N, P, V, K)
    chosen: Tensor  # (S, N, P) long
    rejected: Tensor  # (S, N, P) long
    valid: Tensor  # (S, N, P) 1.0 / 0.0
    dF: Tensor  # (S, N, P, K) f(x, chosen) - f(x, rejected)
    rstar: Tensor  # (S, N, P, V) true reward of every candidate


@dataclass
class BanditWorld:
    """Spec §8.1's generator, one world per seed, stacked: r* = u*ᵀs with ‖u*‖ = 2, behaviour μ^T ∝ exp(b_Tᵀ f)."""

    u_star: Tensor  # (S, K), zero on q and n
    b: Tensor  # (S, N, K)
    fine: FineTuning
    pairs: PairSet  # 𝒟_PL^T (training signal)
    val: PairSet  # extra prompts per domain: model selection and β tuning on training domains
    test: PairSet  # held-out evaluation

    @property
    def seeds(self) -> int:
        return self.u_star.shape[0]

    @property
    def n_dom(self) -> int:
        return self.b.shape[1]

    @property
    def features(self) -> int:
        """K, the length of f(x, y) (3·block)."""
        return self.u_star.shape[1]

    @classmethod
    def generate(cls, rngs: Sequence[np.random.Generator], st: BanditSettings) -> BanditWorld:
        """One world per generator (seed), deterministic for each generator's state."""
        if not rngs:
            raise ValueError("need at least one seed's generator")
        worlds = [_one_world(rng, st) for rng in rngs]

        def stack(get) -> Tensor:
            arr = np.stack([get(w) for w in worlds])
            return torch.as_tensor(arr, dtype=torch.long if arr.dtype.kind in "iu" else DTYPE)

        def pair_set(key: str) -> PairSet:
            F, chosen, rejected = stack(lambda w: w[key][0]), stack(lambda w: w[key][1]), stack(lambda w: w[key][2])
            pick = lambda idx: torch.take_along_dim(F, idx[..., None, None], -2).squeeze(-2)  # noqa: E731
            u = stack(lambda w: w["u"])
            return PairSet(F, chosen, rejected, stack(lambda w: w[key][3]).to(DTYPE), pick(chosen) - pick(rejected),
                           torch.einsum("snpvk,sk->snpv", F, u))

        F, resp = stack(lambda w: w["fine"][0]), stack(lambda w: w["fine"][1])  # (S,N,P,V,K), (S,N,P,r)
        r = st.sft_responses
        response = resp.flatten(-2)
        fex = torch.take_along_dim(F.repeat_interleave(r, 2), response[..., None, None], -2).squeeze(-2)
        counts = torch.nn.functional.one_hot(resp, st.candidates).sum(-2).to(DTYPE)
        return cls(stack(lambda w: w["u"]), stack(lambda w: w["b"]), FineTuning(F, response, fex, counts, r),
                   pair_set("pairs"), pair_set("val"), pair_set("test"))


def _one_world(rng: np.random.Generator, st: BanditSettings) -> dict:
    """One seed's world as numpy arrays, every draw from `rng` in a fixed order."""
    N, V, block = st.n_dom, st.candidates, st.block
    u = rng.standard_normal(block)
    u *= 2 / np.linalg.norm(u)
    means = rng.standard_normal((N, block))
    b_shared = np.concatenate([-0.3 * u, np.zeros(block), 0.8 * rng.standard_normal(block)])
    eps = np.concatenate([0.3 * rng.standard_normal((N, block)), 0.5 * rng.standard_normal((N, block)),
                          0.3 * rng.standard_normal((N, block))], 1)
    b, u_full = b_shared + eps, np.concatenate([u, np.zeros(2 * block)])

    def prompts(T: int, P: int) -> np.ndarray:
        s, q = rng.standard_normal((P, V, block)), means[T] + 0.7 * rng.standard_normal((P, V, block))
        return np.concatenate([s, q, rng.standard_normal((P, V, block))], -1)

    def sample(F: np.ndarray, T: int, n: int) -> np.ndarray:  # n responses per prompt from μ^T, (P, n)
        logits = F @ b[T]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        cum = np.cumsum(p / p.sum(-1, keepdims=True), -1)
        return np.minimum((rng.random((F.shape[0], n, 1)) > cum[:, None, :]).sum(-1), V - 1)

    def pairs(T: int, P: int) -> tuple:
        F = prompts(T, P)
        y, rew = sample(F, T, 2), F @ u_full
        rows = np.arange(P)
        first_wins = rng.random(P) < 1 / (1 + np.exp(-(rew[rows, y[:, 0]] - rew[rows, y[:, 1]])))
        chosen, rejected = np.where(first_wins, y[:, 0], y[:, 1]), np.where(first_wins, y[:, 1], y[:, 0])
        return F, chosen, rejected, y[:, 0] != y[:, 1]

    out: dict = {"u": u_full, "b": b, "fine": [], "pairs": [], "val": [], "test": []}
    for T in range(N):
        F = prompts(T, st.sft_prompts)
        out["fine"].append((F, sample(F, T, st.sft_responses)))
        for key, P in (("pairs", st.pl_prompts), ("val", st.val_prompts), ("test", st.test_prompts)):
            out[key].append(pairs(T, P))
    for key in ("fine", "pairs", "val", "test"):
        out[key] = tuple(np.stack(parts) for parts in zip(*out[key], strict=True))
    return out



def world_slice(world: BanditWorld, seed: int) -> BanditWorld:
    """The world of one seed (leading dimension kept)."""
    cut = slice(seed, seed + 1)

    def pairs(p: PairSet) -> PairSet:
        return PairSet(*(getattr(p, f)[cut] for f in ("F", "chosen", "rejected", "valid", "dF", "rstar")))

    f = world.fine
    return BanditWorld(world.u_star[cut], world.b[cut],
                       FineTuning(f.F[cut], f.response[cut], f.fex[cut], f.counts[cut], f.per_prompt),
                       pairs(world.pairs), pairs(world.val), pairs(world.test))

