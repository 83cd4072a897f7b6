"""Variant A of the meta-learned reward model (spec ../shared/specs/meta-reward.md §8.1): a log-linear multi-domain
contextual bandit with exact expectations, the SFT start, Algorithm 2 (reward-weighted regression on a domain's
fine-tuning data), Algorithm 1 (meta-training of a linear reward model through `bilevel.hypergradient`) and the
printed Eq. 13 kept as a documented wrong formula. Baselines that learn from preference pairs are in
`bandit_baselines.py`.

Layout: the world is stacked over seeds S and domains N; training runs are stacked as rows M (held-out fold, s_h, β,
...) per seed, so one call trains every (seed, row) at once. Policy parameters in the joint layout are
(S, M, N + 1, K) = [θ_shared, θ_1 .. θ_N]; in the split layout (one independent run per domain, Algorithm 2 applied to
each domain separately) (S, M, N, 2, K) = [θ_shared, θ_T] per domain. Either gives θ_eff (S, M, N, K) =
s_h·θ_shared + θ_T, and π_θ(y|x) = softmax_y(f(x, y)ᵀ θ_eff).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field, model_validator
from torch import Tensor
from torch.nn.functional import log_softmax, softplus

from collabalign.config import Strict
from collabalign.methods.meta_reward.bilevel import finite_difference, hypergradient, pl_loss, reward_weights

BLOCK = 4  # s, q and n each have 4 coordinates
K = 3 * BLOCK
LOG_WEIGHT_CAP = 200.0  # float64 guard on log w = r / β (w <= e^200); never reached at β >= 1 in this world
DTYPE = torch.float64


class BanditSettings(Strict):
    """World sizes and every algorithm's hyperparameters (spec §8.1, §9 item 8)."""

    n_dom: int = Field(4, ge=2)
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
    N, V = st.n_dom, st.candidates
    u = rng.standard_normal(BLOCK)
    u *= 2 / np.linalg.norm(u)
    means = rng.standard_normal((N, BLOCK))
    b_shared = np.concatenate([-0.3 * u, np.zeros(BLOCK), 0.8 * rng.standard_normal(BLOCK)])
    eps = np.concatenate([0.3 * rng.standard_normal((N, BLOCK)), 0.5 * rng.standard_normal((N, BLOCK)),
                          0.3 * rng.standard_normal((N, BLOCK))], 1)
    b, u_full = b_shared + eps, np.concatenate([u, np.zeros(2 * BLOCK)])

    def prompts(T: int, P: int) -> np.ndarray:
        s, q = rng.standard_normal((P, V, BLOCK)), means[T] + 0.7 * rng.standard_normal((P, V, BLOCK))
        return np.concatenate([s, q, rng.standard_normal((P, V, BLOCK))], -1)

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


@dataclass(frozen=True)
class Rows:
    """Settings of the runs stacked per seed: held-out fold, s_h and β of each row."""

    fold: Tensor  # (M,) long
    sh: Tensor  # (M,) 0.0 / 1.0
    beta: Tensor  # (M,)

    @classmethod
    def grid(cls, folds: Sequence[int], sh_values: Sequence[int], betas: Sequence[float], n_dom: int) -> Rows:
        """Every (fold, s_h, β), in that nesting order."""
        for h in folds:
            if not 0 <= h < n_dom:
                raise ValueError(f"held-out domain {h} is outside 0..{n_dom - 1}")
        for s in sh_values:
            if s not in (0, 1):
                raise ValueError(f"s_h must be 0 or 1, got {s}")
        for b in betas:
            if not b > 0:
                raise ValueError(f"β must be > 0, got {b}")
        combos = list(itertools.product(folds, sh_values, betas))
        if not combos:
            raise ValueError("no rows: folds, s_h values and betas must be non-empty")
        f, s, b = zip(*combos, strict=True)
        return cls(torch.tensor(f), torch.tensor(s, dtype=DTYPE), torch.tensor(b, dtype=DTYPE))

    def __len__(self) -> int:
        return len(self.fold)

    def repeat(self, times: int) -> Rows:
        return Rows(self.fold.repeat(times), self.sh.repeat(times), self.beta.repeat(times))

    def train_mask(self, n_dom: int) -> Tensor:
        """(M, N): 1 on each row's training domains."""
        return 1.0 - torch.nn.functional.one_hot(self.fold, n_dom).to(DTYPE)


def joint_eff(theta: Tensor, sh: Tensor) -> Tensor:
    """θ_eff (S, M, N, K) from the joint layout (S, M, N + 1, K)."""
    return sh.view(1, -1, 1, 1) * theta[:, :, :1] + theta[:, :, 1:]


def split_eff(theta: Tensor, sh: Tensor) -> Tensor:
    """θ_eff (S, M, N, K) from the split layout (S, M, N, 2, K)."""
    return sh.view(1, -1, 1, 1) * theta[..., 0, :] + theta[..., 1, :]


def log_probs(F: Tensor, eff: Tensor) -> Tensor:
    """log π(y|x) (S, M, N, P, V) for world features F (S, N, P, V, K)."""
    return log_softmax(torch.einsum("snpvk,smnk->smnpv", F, eff), -1)


def margins(pairs: PairSet, eff: Tensor) -> Tensor:
    """log π(chosen|x) - log π(rejected|x) (S, M, N, P); the normaliser cancels for a shared candidate set."""
    return torch.einsum("snpk,smnk->smnp", pairs.dF, eff)


def example_log_probs(fine: FineTuning, eff: Tensor) -> Tensor:
    """log π of every fine-tuning example (S, M, N, E)."""
    lse = torch.logsumexp(torch.einsum("snpvk,smnk->smnpv", fine.F, eff), -1)
    return torch.einsum("snek,smnk->smne", fine.fex, eff) - lse.repeat_interleave(fine.per_prompt, -1)


def log_weights(rewards: Tensor, beta: Tensor | float, bound: float | None) -> Tensor:
    """r / β (optionally r bounded as c·tanh(r / c)), capped at LOG_WEIGHT_CAP; exp of it is the weight of Eq. 10."""
    r = bound * torch.tanh(rewards / bound) if bound else rewards
    return (r / beta).clamp(max=LOG_WEIGHT_CAP)


def preference_accuracy(pairs: PairSet, eff: Tensor, weights: Tensor | None = None) -> Tensor:
    """A_PL (Eq. 26; lengths are equal) per (seed, row): pooled over the domains `weights` (M, N) selects, else per
    domain (S, M, N). Ties count as errors."""
    hit = (margins(pairs, eff) > 0).to(DTYPE)
    valid = pairs.valid[:, None]
    if weights is None:
        return (hit * valid).sum(-1) / valid.sum(-1)
    w = valid * weights[None, :, :, None]
    return (hit * w).sum((-1, -2)) / w.sum((-1, -2))


def minibatch_counts(gen: torch.Generator, shape: tuple[int, ...], examples: int, batch: int) -> Tensor:
    """(*shape, examples): each minibatch (drawn without replacement) as multiplicities / batch."""
    idx = torch.rand((*shape, examples), generator=gen).argsort(-1)[..., :batch]
    return torch.zeros((*shape, examples), dtype=DTYPE).scatter_(-1, idx, 1.0 / batch)


def sft(world: BanditWorld, st: BanditSettings) -> Tensor:
    """θ_SFT (S, 2, N + 1, K) for s_h = 0 and 1: gradient ascent on the mean log-likelihood of all domains' 𝒟^T
    minus λ/2 ‖θ‖² (`sft_steps` full-batch steps of `sft_lr`)."""
    S, N = world.seeds, world.n_dom
    sh = torch.tensor([0.0, 1.0], dtype=DTYPE)
    target = world.fine.counts[:, None] / world.fine.counts[0].sum()
    theta = torch.zeros(S, 2, N + 1, K, dtype=DTYPE)
    for _ in range(st.sft_steps):
        theta.requires_grad_(True)
        obj = (target * log_probs(world.fine.F, joint_eff(theta, sh))).sum()
        (g,) = torch.autograd.grad(obj - st.weight_decay / 2 * (theta**2).sum(), theta)
        theta = (theta + st.sft_lr * g).detach()
    return theta


def rwr(world: BanditWorld, theta0: Tensor, phi: Tensor, rows: Rows, st: BanditSettings, counts: Tensor,
        keep: Sequence[int] = ()) -> tuple[Tensor, dict[int, Tensor]]:
    """Algorithm 2 on every domain's 𝒟^T separately: θ ← θ_0 (joint layout (S, M, N + 1, K)), then SGD ascent on
    mean_i w_i log π(y_i|x_i) - λ/2 ‖θ‖² with w = exp(r_φ / β) frozen (φ: (S, M, K)), one minibatch per step from
    `counts` (S, N, steps, E). Returns the checkpoint of minimum full-data training loss (the paper's "converged"
    rule, θ_0 included) and the parameters after each step in `keep`, both in the split layout (S, M, N, 2, K)."""
    S, M, N, steps = phi.shape[0], phi.shape[1], world.n_dom, counts.shape[2]
    theta = torch.stack([theta0[:, :, :1].expand(-1, -1, N, -1), theta0[:, :, 1:]], -2).clone()
    rewards = torch.einsum("snek,smk->smne", world.fine.fex, phi)
    w = reward_weights(log_weights(rewards, rows.beta.view(1, -1, 1, 1), st.reward_bound), 1.0)
    best, best_loss, kept = theta.clone(), torch.full((S, M, N), torch.inf, dtype=DTYPE), {}
    for t in range(steps + 1):
        theta.requires_grad_(True)
        lp = example_log_probs(world.fine, split_eff(theta, rows.sh))
        decay = st.weight_decay / 2 * (theta**2).sum((-1, -2))
        with torch.no_grad():
            loss = -(w * lp).mean(-1) + decay
            better = loss < best_loss
            best_loss = torch.where(better, loss, best_loss)
            best = torch.where(better[..., None, None], theta, best)
        if t == steps:
            break
        (g,) = torch.autograd.grad((w * counts[:, None, :, t] * lp).sum() - decay.sum(), theta)
        theta = (theta + st.alpha * g).detach()
        if t + 1 in keep:
            kept[t + 1] = theta.clone()
    return best.detach(), kept


@dataclass
class MetaTraining:
    """Algorithm 1's output per (seed, row): the selected φ and its trajectory."""

    phi: Tensor  # (S, M, K) selected by validation A_PL on the training domains
    phi_last: Tensor  # (S, M, K) after K outer steps
    best_step: Tensor  # (S, M)
    outer_loss: Tensor  # (K, S, M) outer loss ℓ_PL(θ_D) on each step's outer batch
    eval_steps: list[int]
    val_apl: Tensor  # (evals, S, M) pooled validation A_PL on the training domains (matched D-step policy)
    skipped: Tensor  # (S, M) outer steps whose hypergradient was not finite (φ left unchanged)


class _Objectives:
    """Algorithm 1's inner objective and outer loss for runs grouped (S, H, G): the G rows of a (seed, fold) train on
    the same sampled domain with the same batches, so features are stored once per group. θ = [θ_shared, θ_T] and φ
    are (S, H, G, K); an inner batch is (ψ (S, H, B, V, K) the candidates of B examples' prompts, f (S, H, B, K) the
    examples' features); an outer batch is (dF (S, H, B', K), pair weights (S, H, B'))."""

    def __init__(self, sh: Tensor, beta: Tensor, st: BanditSettings):
        self.sh, self.beta, self.st = sh[None, ..., None], beta[None], st  # (1, H, G, 1), (1, H, G)

    def eff(self, theta: Sequence[Tensor]) -> Tensor:
        return self.sh * theta[0] + theta[1]

    def inner(self, theta: Sequence[Tensor], phi: Sequence[Tensor], batch: tuple[Tensor, Tensor]) -> Tensor:
        """Σ over runs of mean_i w_i(φ) log π_θ(y_i|x_i) - λ/2 ‖θ‖²."""
        psi, f = batch
        eff = self.eff(theta)
        lse = torch.logsumexp(torch.einsum("shbvk,shgk->shgbv", psi, eff), -1)
        lp = torch.einsum("shbk,shgk->shgb", f, eff) - lse
        w = reward_weights(log_weights(torch.einsum("shbk,shgk->shgb", f, phi[0]), self.beta[..., None],
                                       self.st.reward_bound), 1.0)
        return (w * lp).mean(-1).sum() - self.st.weight_decay / 2 * sum((t**2).sum() for t in theta)

    def outer_runs(self, theta: Sequence[Tensor], pairs: tuple[Tensor, Tensor]) -> Tensor:
        """ℓ_PL (Eq. 7) per run (S, H, G) on its outer batch."""
        m = torch.einsum("shjk,shgk->shgj", pairs[0], self.eff(theta))
        w = pairs[1][:, :, None]
        return (pl_loss(m, torch.zeros_like(m)) * w).sum(-1) / w.sum(-1).clamp(min=1)

    def outer(self, theta: Sequence[Tensor], pairs: tuple[Tensor, Tensor]) -> Tensor:
        return self.outer_runs(theta, pairs).sum()


def _batches(world: BanditWorld, T: Tensor, idx: Tensor) -> list[tuple[Tensor, Tensor]]:
    """Inner batches of examples `idx` (S, H, D, B) of domains T (S, H)."""
    s, t = torch.arange(world.seeds)[:, None, None, None], T[:, :, None, None]
    psi = world.fine.F[s, t, idx // world.fine.per_prompt]  # (S, H, D, B, V, K)
    f = world.fine.fex[s, t, idx]
    return [(psi[:, :, d], f[:, :, d]) for d in range(idx.shape[2])]


def _outer_batch(world: BanditWorld, T: Tensor, size: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """`size` pairs per (seed, fold) drawn without replacement among the valid pairs of domain T (S, H) (padded
    with tied pairs at weight 0 when there are fewer): picks, dF, weights."""
    s = torch.arange(world.seeds)[:, None]
    valid = world.pairs.valid[s, T]  # (S, H, P)
    picks = (torch.rand(valid.shape, generator=gen) + 2 * valid).topk(min(size, valid.shape[-1]), -1).indices
    return picks, world.pairs.dF[s[..., None], T[..., None], picks], valid.gather(-1, picks)


def validation(world: BanditWorld, eff: Tensor, rows: Rows) -> tuple[Tensor, Tensor]:
    """Pooled A_PL and ℓ_PL (S, M) on the validation pairs of each row's training domains (never its held-out one)."""
    mask = rows.train_mask(world.n_dom)
    w = world.val.valid[:, None] * mask[None, :, :, None]
    loss = (softplus(-margins(world.val, eff)) * w).sum((-1, -2)) / w.sum((-1, -2))
    return preference_accuracy(world.val, eff, mask), loss


def _validation(world: BanditWorld, theta0: Tensor, phi: Tensor, rows: Rows, st: BanditSettings,
                counts: Tensor) -> tuple[Tensor, Tensor]:
    """`validation` of the matched (D-step) RWR policy of φ on every training domain."""
    _, kept = rwr(world, theta0, phi, rows, st, counts, keep=(counts.shape[2],))
    return validation(world, split_eff(kept[counts.shape[2]], rows.sh), rows)


def meta_train(world: BanditWorld, theta_sft: Tensor, rows: Rows, st: BanditSettings, gen: torch.Generator,
               progress: bool = False) -> MetaTraining:
    """Algorithm 1 (spec §3.1) for every (seed, row) at once: each outer step samples one training domain per (seed,
    fold), restarts θ at θ_SFT, runs D inner SGD steps on minibatches of B_in, takes the hypergradient of ℓ_PL on
    B_out pairs of that domain, clips its norm per row and steps φ by SGD. Rows of one fold share domains and
    batches (common random numbers across β and s_h; every fold needs the same number of rows). Every E steps (and
    at the end) φ is scored by the pooled validation A_PL of the matched policy on the training domains; the best
    (ties: lower validation ℓ_PL, then the earlier step) is returned."""
    S, M, N, E = world.seeds, len(rows), world.n_dom, world.fine.fex.shape[2]
    D = st.inner_steps
    folds, sizes = rows.fold.unique(return_counts=True)
    if not (sizes == sizes[0]).all():
        raise ValueError("meta_train needs the same number of rows in every fold")
    H, G = len(folds), int(sizes[0])
    order = torch.argsort(rows.fold, stable=True)  # rows grouped by fold: (H, G)
    undo = torch.argsort(order)
    theta0 = theta_sft[:, rows.sh.long()]  # (S, M, N + 1, K)
    grouped = theta0[:, order].view(S, H, G, N + 1, K)
    objectives = _Objectives(rows.sh[order].view(H, G), rows.beta[order].view(H, G), st)
    phi = torch.zeros(S, M, K, dtype=DTYPE)  # in the caller's row order
    eval_counts = minibatch_counts(gen, (S, N, D), E, st.inner_batch)
    best_phi, best_acc = phi.clone(), torch.full((S, M), -1.0, dtype=DTYPE)
    best_loss, best_step = torch.zeros(S, M, dtype=DTYPE), torch.zeros(S, M, dtype=torch.long)
    eval_steps = sorted(set(range(0, st.outer_steps, st.eval_every)) | {st.outer_steps})
    val_curve, losses, skipped = [], [], torch.zeros(S, M, dtype=torch.long)
    s_idx, h_idx, g_idx = torch.arange(S)[:, None, None], torch.arange(H)[:, None], torch.arange(G)
    for k in range(st.outer_steps + 1):
        if k in eval_steps:
            acc, loss = _validation(world, theta0, phi, rows, st, eval_counts)
            better = (acc > best_acc) | ((acc == best_acc) & (loss < best_loss))
            best_acc, best_loss = torch.where(better, acc, best_acc), torch.where(better, loss, best_loss)
            best_phi = torch.where(better[..., None], phi, best_phi)
            best_step = torch.where(better, k, best_step)
            val_curve.append(acc)
            if progress:
                print(f"meta-reward bandit: outer step {k}/{st.outer_steps}, validation A_PL {acc.mean():.3f}",
                      flush=True)
        if k == st.outer_steps:
            break
        offset = torch.randint(0, N - 1, (S, H), generator=gen)
        T = offset + (offset >= folds).long()  # a training domain per (seed, fold)
        idx = torch.rand((S, H, D, E), generator=gen).argsort(-1)[..., :st.inner_batch]
        _, dF, pair_w = _outer_batch(world, T, st.outer_batch, gen)
        start = [grouped[:, :, :, 0], grouped[s_idx, h_idx, g_idx, 1 + T[..., None]]]
        phi_g = phi[:, order].view(S, H, G, K)
        hg = hypergradient(objectives.inner, objectives.outer, start, [phi_g], _batches(world, T, idx),
                           (dF, pair_w), st.alpha)
        with torch.no_grad():
            losses.append(objectives.outer_runs(hg.theta, (dF, pair_w)).reshape(S, M)[:, undo])
        g = hg.grad[0].reshape(S, M, K)[:, undo]
        finite = torch.isfinite(g).all(-1)
        skipped += (~finite).long()
        g = torch.where(finite[..., None], g, 0.0)
        phi = phi - st.eta * g * (st.clip / g.norm(dim=-1, keepdim=True).clamp(min=st.clip))
    outer = torch.stack(losses) if losses else torch.zeros(0, S, M, dtype=DTYPE)
    return MetaTraining(best_phi, phi, best_step, outer, eval_steps, torch.stack(val_curve), skipped)


def heldout_metrics(world: BanditWorld, eff: Tensor, rows: Rows, temperatures: Sequence[float]) -> dict[str, Tensor]:
    """Per (seed, row) on the row's held-out domain's test pairs: A_PL, the expected true reward E_π[r*] over the test
    prompts at each temperature (π^{1/τ} renormalised), and the win rate P(r*(ŷ) > r*(y_ref)) for ŷ ~ π against the
    pair's preferred response (exact expectation; ties lose)."""
    S, M = eff.shape[:2]
    out = {"apl": torch.zeros(S, M, dtype=DTYPE), "win": torch.zeros(S, M, dtype=DTYPE)}
    out |= {f"reward@{t:g}": torch.zeros(S, M, dtype=DTYPE) for t in temperatures}
    test = world.test
    for h in rows.fold.unique().tolist():  # loop over held-out domains (at most N), each batched over rows
        sel = rows.fold == h
        e = eff[:, sel, h]  # (S, m, K)
        logits = torch.einsum("spvk,smk->smpv", test.F[:, h], e)
        valid = test.valid[:, None, h]
        margin = torch.einsum("spk,smk->smp", test.dF[:, h], e)
        out["apl"][:, sel] = ((margin > 0).to(DTYPE) * valid).sum(-1) / valid.sum(-1)
        r = test.rstar[:, None, h]  # (S, 1, P, V)
        ref = torch.take_along_dim(r, test.chosen[:, None, h, :, None], -1)
        wins = (torch.softmax(logits, -1) * (r > ref).to(DTYPE)).sum(-1)
        out["win"][:, sel] = (wins * valid).sum(-1) / valid.sum(-1)
        for t in temperatures:
            out[f"reward@{t:g}"][:, sel] = (torch.softmax(logits / t, -1) * r).sum(-1).mean(-1)
    return out


def check_hypergradient(world: BanditWorld, theta_sft: Tensor, fold: int, st: BanditSettings, gen: torch.Generator,
                        steps: int = 5, eps: float = 1e-5) -> dict[str, float]:
    """`bilevel.hypergradient` against central finite differences on a small instance of the bandit (seed 0, one
    training domain, s_h = 0 and 1 batched, β = 1, a random φ): the largest error relative to max |g|, the
    first-order approximation's relative difference, and the printed Eq. 13's relative error (s_h = 0 run, where θ
    and φ both live in the 12 feature coordinates)."""
    if not 0 <= fold < world.n_dom:
        raise ValueError(f"held-out domain {fold} is outside 0..{world.n_dom - 1}")
    small, T = world_slice(world, 0), torch.full((1, 1), (fold + 1) % world.n_dom)
    objectives = _Objectives(torch.tensor([[0.0, 1.0]], dtype=DTYPE), torch.ones(1, 2, dtype=DTYPE), st)
    E = small.fine.fex.shape[2]
    idx = torch.rand((1, 1, steps, E), generator=gen).argsort(-1)[..., :st.inner_batch]
    batches = _batches(small, T, idx)
    picks, dF, pair_w = _outer_batch(small, T, st.outer_batch, gen)
    phi = [0.5 * torch.randn(1, 1, 2, K, generator=gen, dtype=DTYPE)]
    start = theta_sft[:1, None]  # (1, 1, 2, N + 1, K): s_h = 0 and 1
    theta0 = [start[..., 0, :], start[..., 1 + T[0, 0], :]]
    args = (objectives.inner, objectives.outer, theta0, phi, batches, (dF, pair_w), st.alpha)
    exact = hypergradient(*args).grad[0]
    first = hypergradient(*args, first_order=True).grad[0]
    fd = finite_difference(*args, eps)[0]
    scale = float(fd.abs().max())
    t, ex = int(T[0, 0]), idx[0, 0]
    inner = [(psi[0, 0], small.fine.response[0, t, ex[d]], f[0, 0]) for d, (psi, f) in enumerate(batches)]
    p = picks[0, 0]
    outer = (small.pairs.F[0, t, p], small.pairs.chosen[0, t, p], small.pairs.rejected[0, t, p])
    printed = paper_eq13(theta0[1][0, 0, 0], phi[0][0, 0, 0], inner, outer, st.alpha, 1.0, st.weight_decay)
    return {"relative_error": float((exact - fd).abs().max()) / scale, "max_abs_gradient": scale,
            "first_order_relative_difference": float((first - exact).abs().max()) / scale,
            "paper_eq13_relative_error": float((printed - fd[0, 0, 0]).abs().max() / fd[0, 0, 0].abs().max())}


def world_slice(world: BanditWorld, seed: int) -> BanditWorld:
    """The world of one seed (leading dimension kept)."""
    cut = slice(seed, seed + 1)

    def pairs(p: PairSet) -> PairSet:
        return PairSet(*(getattr(p, f)[cut] for f in ("F", "chosen", "rejected", "valid", "dF", "rstar")))

    f = world.fine
    return BanditWorld(world.u_star[cut], world.b[cut],
                       FineTuning(f.F[cut], f.response[cut], f.fex[cut], f.counts[cut], f.per_prompt),
                       pairs(world.pairs), pairs(world.val), pairs(world.test))


def paper_eq13(theta0: Tensor, phi: Tensor, inner: Sequence[tuple[Tensor, Tensor, Tensor]],
               outer: tuple[Tensor, Tensor, Tensor], alpha: float, beta: float, weight_decay: float = 0.0) -> Tensor:
    """Eq. 13 AS PRINTED, for a log-linear policy π_θ(y|x) = softmax_y(ψ(x, y)ᵀθ) and a linear reward r = φᵀf. It
    is WRONG (spec §3.2): it drops σ(-Δ) and the minus sign of Eq. 30, has no ∇_φ r at all, and repeats step t's
    factor inside the product (index t for j). Read literally with gradients as row vectors (Appendix B's
    convention), each summand R^t ∇F^t (I + α R^t ∇²F^t)^{D-1-t} is a θ-space row vector, and so is the leading
    (α/β)(∇log π(y_k) - ∇log π(y'_k)); the only product of the two that is a vector is elementwise, so the result
    is a θ-space vector, not a φ-gradient. Minibatches are averaged, as in the corrected rule.

    inner: per step (ψ (B, V, dθ) candidates' features, y (B,) sampled responses, f (B, dφ) their reward features);
    outer: (ψ (B', V, dθ), chosen (B',), rejected (B',)). θ_t follow the same inner loop as `bilevel.inner_loop`."""
    if not beta > 0:
        raise ValueError(f"β must be > 0, got {beta}")
    theta, total, D = theta0.detach().clone(), torch.zeros_like(theta0), len(inner)
    eye = torch.eye(theta0.numel(), dtype=theta0.dtype)
    for t, (psi, y, f) in enumerate(inner):
        R = torch.exp(f @ phi / beta)  # (B,)
        p = torch.softmax(psi @ theta, -1)
        mean = torch.einsum("bv,bvd->bd", p, psi)
        grads = psi[torch.arange(len(y)), y] - mean  # ∇_θ log π_θt(y_i|x_i)
        cov = torch.einsum("bv,bvd,bve->bde", p, psi, psi) - torch.einsum("bd,be->bde", mean, mean)
        hess = -(R[:, None, None] * cov).mean(0)  # mean_i R_i ∇²_θ log π (Hessian of log-linear = -Cov)
        step_grad = (R[:, None] * grads).mean(0)
        total = total + step_grad @ torch.linalg.matrix_power(eye + alpha * hess, D - 1 - t)
        theta = theta + alpha * (step_grad - weight_decay * theta)
    psi, chosen, rejected = outer
    rows = torch.arange(len(chosen))
    diff = (psi[rows, chosen] - psi[rows, rejected]).mean(0)  # log Z cancels in the difference of gradients
    return alpha / beta * diff * total
