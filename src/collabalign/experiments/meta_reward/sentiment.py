"""The sentiment task (paper §5.1, Figs. 2-4) at CPU scale: leave one Amazon domain (or one domain of the user's JSONL
pairs) out, every method on a SmolLM2 policy, scored by held-out A_PL (Eq. 26), by a judge trained only on the
held-out domain's labelled reviews (JSONL: its chosen and rejected replies) (median P(positive) of generations at four
temperatures, three repetitions: Fig. 3) and by the win rate against each prompt's preferred review. Two β
protocols: one shared β for every method that has one, and β tuned per method on the training domains' validation
pairs. Claims are declared below, before the cells run; seeds are the replicates, held-out domains the cells of "in
every domain" claims."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np

from collabalign import claims
from collabalign.experiments.meta_reward import plots
from collabalign.experiments.meta_reward.sentiment_cell import run_cell
from collabalign.experiments.meta_reward.sentiment_config import BETA_METHODS, SentimentConfig
from collabalign.experiments.meta_reward.sentiment_setup import Setup, build, fingerprint
from collabalign.runs import Part, RunDir, cached_json
from collabalign.seeding import Seeds

CHANCE = 0.5
BASELINES = ("sft", "ppo(tr)", "ppo(tr+te)", "dpo", "hpl")  # the paper's (§4.1)
PREFERENCE = ("ours", "ppo(tr)", "ppo(tr+te)", "dpo", "hpl", "bt+rwr")

LEARNED = claims.superiority(
    "[LM] The task is learned: ours above chance and above SFT on held-out A_PL",
    "per seed, fold-mean held-out A_PL of ours (shared β) minus SFT's above 0, and ours minus chance (0.5) above 0, "
    "Holm over the two")
HEADLINE = claims.superiority(
    "[LM] Ours > every baseline on every held-out domain (held-out A_PL)",
    "per seed, held-out A_PL of ours minus each of SFT, PPO(TR), PPO(TR+TE), DPO, HPL above 0 in every (domain, "
    "baseline) cell, Holm over the cells")
OVER_BT = claims.superiority(
    "[LM] Ours > BT+RWR on held-out A_PL (what meta-learning adds; spec's ablation)",
    "per seed, fold-mean held-out A_PL of ours minus BT+RWR above 0")
OVER_SFT = claims.superiority(
    "[LM] Preference-using methods > SFT on held-out A_PL",
    "per seed, fold-mean held-out A_PL of each of ours, PPO(TR), PPO(TR+TE), DPO, HPL, BT+RWR minus SFT's above 0, "
    "Holm over the methods")
TEST_PROMPTS = claims.superiority(
    "[LM] PPO(TR+TE) > PPO(TR) on held-out A_PL",
    "per seed, fold-mean held-out A_PL of PPO(TR+TE) minus PPO(TR) above 0")
LARGER_BETA = claims.superiority(
    "[LM] Larger β gives better held-out A_PL for ours (Fig. 4)",
    "per seed, least-squares slope of the fold-mean held-out A_PL of ours against log β over beta_grid, above 0")
JUDGE = claims.superiority(
    "[LM] Ours has the highest median judge reward at every temperature (Fig. 3)",
    "per seed, fold-mean of the median judge P(positive) of generations (3 repetitions x the eval prompts) of ours "
    "minus each baseline's, above 0 in every (temperature, baseline) cell, Holm over the cells")
WIN = claims.superiority(
    "[LM] Ours has the highest win rate against the preferred reference",
    "per seed, fold-mean win rate (judge score of the generation above the prompt's preferred review; temperature "
    "0.25, ties lose) of ours minus each baseline's, above 0 for every baseline, Holm over the baselines")
ORACLE_APL = claims.superiority(
    "[LM] The oracle has learned: RWR on the judge's own reward above SFT on held-out A_PL",
    "per seed, fold-mean held-out A_PL of the oracle (shared β) minus SFT's above 0")
ORACLE_JUDGE = claims.superiority(
    "[LM] The oracle has learned: RWR on the judge's own reward above SFT on the judge",
    "per seed, fold-mean of the mean judge P(positive) of the oracle's generations minus SFT's, above 0 at every "
    "temperature, Holm over the temperatures")
PROTOCOL_CLAIMS = (LEARNED, HEADLINE, OVER_BT, OVER_SFT, TEST_PROMPTS, JUDGE, WIN)
GATES = (ORACLE_APL, ORACLE_JUDGE)  # the task can be learned at all: the reference learner, on both scores
CLAIMS = (*GATES, *PROTOCOL_CLAIMS, LARGER_BETA)


def not_run_part(reason: str) -> Part:
    """The part when it cannot run (no data folder): every declared claim recorded as not run."""
    return Part([claims.not_run(c, reason) for c in CLAIMS], notes=[f"Sentiment task not run: {reason}."])


def cached_cell(setup: Setup, held_out: str, replicate: int, seeds: Seeds, folder: Path, progress: bool) -> dict:
    """One (held-out domain, seed) cell, read from `folder` when it finished there with the same settings."""
    seed = seeds.entropy("meta_reward/replicate", replicate) % 2**31

    def compute() -> dict:
        start = time.perf_counter()
        out = run_cell(setup, held_out, seed, progress)
        return out | {"seconds": time.perf_counter() - start, "replicate": replicate}

    return cached_json(folder / f"{held_out}-seed{replicate}.json", fingerprint(setup, seed), compute)


def policy_key(cell: dict, method: str, protocol: str, beta: float) -> str:
    """The cell's policy of `method` under a protocol: its tuned key, or method@β (methods without β: the name)."""
    if method not in BETA_METHODS:
        return method
    return cell["tuned"][method] if protocol == "tuned" else f"{method}@{beta:g}"


def values(cells: dict, method: str, protocol: str, beta: float, metric) -> np.ndarray:
    """(seeds, domains) array of metric(cell, policy key)."""
    return np.array([[metric(c, policy_key(c, method, protocol, beta)) for c in row] for row in cells.values()])


def apl(cell: dict, key: str) -> float:
    return cell["apl"][key]


def median_judge(temp: str):
    return lambda cell, key: float(np.median(cell["judge"][key][temp]["scores"]))


def mean_judge(temp: str):
    return lambda cell, key: float(np.mean(cell["judge"][key][temp]["scores"]))


def gates(cfg: SentimentConfig, cells: dict) -> list[dict]:
    """The oracle (the shared β; it has no tuned β) against SFT: held-out A_PL, and the judge at every temperature."""
    def mean(method, metric=apl):
        return values(cells, method, "shared", cfg.beta, metric).mean(1)

    temps = [f"{t:g}" for t in cfg.temperatures]
    judged = {m: {t: {"mean": float(mean(m, mean_judge(t)).mean()), "median": float(mean(m, median_judge(t)).mean())}
                  for t in temps} for m in ("oracle", "sft")}
    return [ORACLE_APL.decide(mean("oracle"), mean("sft"), oracle=float(mean("oracle").mean()),
                              sft=float(mean("sft").mean())),
            ORACLE_JUDGE.decide_cells({f"T={t}": (mean("oracle", mean_judge(t)), mean("sft", mean_judge(t)))
                                       for t in temps}, judge=judged)]


def win_rate(temp: str):
    return lambda cell, key: cell["judge"][key][temp]["win"]


def decide(cfg: SentimentConfig, cells: dict, protocol: str) -> list[dict]:
    """The protocol's claims: cells maps replicate -> [cell per held-out domain]."""
    beta, tag = cfg.beta, {"shared": f" [shared β = {cfg.beta:g}]", "tuned": " [β tuned per method]"}[protocol]

    def mean(method, metric=apl):
        return values(cells, method, protocol, beta, metric).mean(1)

    def named(claim):
        return claims.Claim(claim.name + tag, claim.expected, claim.rule, claim.margin)

    ours = values(cells, "ours", protocol, beta, apl)
    temps = [f"{t:g}" for t in cfg.temperatures]
    means = {m: float(mean(m).mean()) for m in ("ours", "bt+rwr", "oracle", *BASELINES)}
    low = f"{min(cfg.temperatures):g}"
    return [
        named(LEARNED).decide_cells({"vs SFT": (mean("ours"), mean("sft")), "vs chance": (mean("ours"), CHANCE)},
                                    **means),
        named(HEADLINE).decide_cells({f"{d} vs {b}": (ours[:, j], values(cells, b, protocol, beta, apl)[:, j])
                                      for j, d in enumerate(cfg.held_out) for b in BASELINES}, **means),
        named(OVER_BT).decide(mean("ours"), mean("bt+rwr"), **means),
        named(OVER_SFT).decide_cells({m: (mean(m), mean("sft")) for m in PREFERENCE}, **means),
        named(TEST_PROMPTS).decide(mean("ppo(tr+te)"), mean("ppo(tr)"), **means),
        named(JUDGE).decide_cells({f"T={t} vs {b}": (mean("ours", median_judge(t)), mean(b, median_judge(t)))
                                   for t in temps for b in BASELINES},
                                  medians={m: {t: float(mean(m, median_judge(t)).mean()) for t in temps}
                                           for m in ("ours", "bt+rwr", "oracle", *BASELINES)},
                                  means={m: {t: float(mean(m, mean_judge(t)).mean()) for t in temps}
                                         for m in ("ours", "bt+rwr", "oracle", *BASELINES)}),
        named(WIN).decide_cells({b: (mean("ours", win_rate(low)), mean(b, win_rate(low))) for b in BASELINES},
                                win_rates={m: float(mean(m, win_rate(low)).mean())
                                           for m in ("ours", "bt+rwr", "oracle", *BASELINES)}),
    ]


def sweep(cfg: SentimentConfig, cells: dict) -> dict:
    """Ours' held-out A_PL against β: the slope claim and the per-β means."""
    grid = sorted(set(cfg.beta_grid))
    per_beta = np.stack([values(cells, "ours", "shared", b, apl).mean(1) for b in grid], 1)  # (seeds, betas)
    if len(grid) < 2:
        return claims.not_run(LARGER_BETA, "beta_grid has fewer than two values")
    slopes = claims.slopes(grid, per_beta, log_x=True, log_y=False)
    return LARGER_BETA.decide(slopes, 0.0, apl_by_beta={f"{b:g}": float(per_beta[:, i].mean())
                                                        for i, b in enumerate(grid)})


def samples_table(cfg: SentimentConfig, cell: dict) -> str:
    """Markdown: the first cell's kept generations (lowest temperature) of SFT, ours and the oracle at the shared β,
    with the judge's P(positive)."""
    temp, rows = f"{min(cfg.temperatures):g}", []
    for key in ("sft", f"ours@{cfg.beta:g}", f"oracle@{cfg.beta:g}"):
        for s in cell["judge"].get(key, {}).get(temp, {}).get("samples", []):
            text = f"{s['prompt']} {s['response']}".replace("|", "/").replace("\n", " ")
            rows.append(f"| {key} | {text} | {s['judge']:.2f} |")
    head = (f"Generations (held-out domain {cell['held_out']}, seed {cell['seed']}, T = {temp}; prompt, then the "
            "policy's words) and the judge's P(positive):\n\n| policy | text | judge |\n|---|---|---|\n")
    return head + "\n".join(rows) if rows else "No generations were kept (a cell computed before they were)."


def part(cfg: SentimentConfig, root: Path | None, seeds: Seeds, run_dir: RunDir, progress: bool) -> Part:
    """Every (held-out domain, seed) cell (cached in run_dir/meta_reward_cells), then both protocols' claims."""
    start = time.perf_counter()
    setup = build(cfg, root, seeds.seed, run_dir.path / "meta_reward_cache", progress)
    folder = run_dir.path / "meta_reward_cells"
    cells = {r: [cached_cell(setup, d, r, seeds, folder, progress) for d in cfg.held_out] for r in range(cfg.seeds)}
    decided = gates(cfg, cells) + decide(cfg, cells, "shared") + decide(cfg, cells, "tuned") + [sweep(cfg, cells)]
    plots.plot_sentiment(run_dir.path / "plots", cfg, cells)
    methods = sorted({k for row in cells.values() for c in row for k in c["apl"]})
    held = {m: {d: float(np.mean([row[j]["apl"][m] for row in cells.values()])) for j, d in enumerate(cfg.held_out)}
            for m in methods}
    tuned = {d: {m: [row[j]["tuned"][m] for row in cells.values()] for m in BETA_METHODS}
             for j, d in enumerate(cfg.held_out)}
    diverged = dict(Counter(k for row in cells.values() for c in row for k in c.get("diverged", [])))  # -> cells
    cell_seconds = [c["seconds"] for row in cells.values() for c in row]
    timed = [c["stage_seconds"] for row in cells.values() for c in row if "stage_seconds" in c]
    stages = {k: float(np.mean([t[k] for t in timed])) for k in timed[0]} if timed else {}
    metrics = {"sentiment": {"held_out_apl": held, "tuned_choices": tuned, "lr": setup.lr, "lr_scores":
                             setup.lr_scores, "data": setup.counts,
                             "judges": {d: j.describe() for d, j in setup.judges.items()},
                             "cell_seconds": cell_seconds, "stage_seconds": stages, "diverged": diverged,
                             "seconds": time.perf_counter() - start}}
    judge_acc = ", ".join(f"{d} {j.accuracy:.3f} on {j.n_test} windows, {j.pair_accuracy:.3f} of the pairs"
                          for d, j in setup.judges.items())
    notes = [f"Sentiment task: {cfg.model} with LoRA (rank {cfg.rank}) on its LM head over cached trunk states; "
             f"reward model: a linear head on {cfg.encoder} features of the response; α = {setup.lr:g} chosen from "
             f"{cfg.lr_grid} by held-out SFT NLL on unlabelled text; D = {cfg.inner_steps}, K = {cfg.outer_steps}, "
             f"meta-test {cfg.test_steps} steps (matched: D); RWR weights '{cfg.weight_norm}'; {cfg.seeds} seeds x "
             f"{len(cfg.held_out)} held-out domains; judge held-out accuracy on response windows: {judge_acc}. "
             f"Chance A_PL is {CHANCE}. Cells took {np.mean(cell_seconds):.0f} s on average "
             f"({sum(cell_seconds) / 60:.1f} min in all, cached ones at their first run's time)"
             + (f"; per stage {', '.join(f'{k} {v:.0f} s' for k, v in stages.items())}." if stages else ".")]
    if diverged:
        notes.append(f"**Diverged policies** (non-finite weights; scored A_PL 0, judge 0, no wins: against their "
                     f"method) in {sum(len(row) for row in cells.values())} cells: "
                     + ", ".join(f"{k} in {n}" for k, n in sorted(diverged.items())) + ".")
    notes.append(samples_table(cfg, cells[0][0]))
    if failed := [c for c in decided[:len(GATES)] if not claims.confirmed(c)]:
        named = "; ".join(f"\"{c['name']}\" is {c['verdict']}" for c in failed)
        notes.append(f"**Learning not shown:** {named}. The orderings below rank methods on a task this run did not "
                     "show to be learnable by its reference learner; read them as checks, not as the paper's claims.")
    return Part(claims=decided, metrics=metrics, notes=notes)
