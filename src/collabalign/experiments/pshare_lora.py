"""P-ShareLoRA reproduction (spec ../shared/specs/pshare-lora.md §8): every method on the §8.1 bilinear preference
problem over seeds (mean ± std) with the paper's ordering as claims, and the §8.2 theory sweeps."""

from __future__ import annotations

import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context

import numpy as np

from collabalign.config import Strict
from collabalign.experiments.pshare_lora_bandit import BanditConfig, bandit_part
from collabalign.experiments.pshare_lora_claims import ordering_claims, table
from collabalign.experiments.pshare_lora_federated import FederatedConfig, federated_part
from collabalign.experiments.pshare_lora_sweeps import SweepConfig, problems, sweep_part
from collabalign.experiments.pshare_lora_text import TextConfig, text_part
from collabalign.methods.pshare_lora import LABELS, METHODS
from collabalign.methods.pshare_lora.synthetic import ProblemConfig, TrainConfig, evaluate, fit_model, generate
from collabalign.runs import Part, RunDir
from collabalign.seeding import Seeds

TITLE = "P-ShareLoRA: personalised reward models sharing a low-rank factor (synthetic)"


class Config(Strict):
    seeds: list[int] = [0, 1, 2]
    problem: ProblemConfig = ProblemConfig()
    train: TrainConfig = TrainConfig()
    methods: list[str] = list(METHODS)
    sweep: SweepConfig = SweepConfig()
    bandit: BanditConfig = BanditConfig()  # spec §8.3, on the main problem's truth
    federated: FederatedConfig = FederatedConfig()  # users as clients, on the main problem
    text: TextConfig = TextConfig()  # spec §8.4: MiniLM reward models on TL;DR-like and HH-RLHF text
    workers: int = 1  # processes for the independent fits (each fit is seeded on its own: results do not change)


def fit(problem: ProblemConfig, tc: TrainConfig, method: str, seed: int) -> dict:
    """Trains `method` on the problem drawn from `seed` and returns its held-out metrics."""
    truth, data, test = generate(problem, seed)
    net, losses = fit_model(truth, data, problem, tc, method, Seeds(seed).torch(f"train-{method}"))
    return {**evaluate(net, truth, test), "train_loss": round(losses[-1], 6), **truth.diversity(problem.k)}


def run_fits(jobs: list[tuple[ProblemConfig, str, int]], tc: TrainConfig, workers: int, progress: bool) -> dict:
    """Every distinct (problem, method, seed) fit once, in order, on `workers` processes; keyed by
    (problem JSON, method, seed)."""
    keys = list(dict.fromkeys((p.model_dump_json(), m, s) for p, m, s in jobs))
    args = [(ProblemConfig.model_validate_json(p), tc, m, s) for p, m, s in keys]
    results = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) if workers > 1 else nullcontext() as pool:
        done = (pool.map if pool else map)(fit, *zip(*args, strict=True))
        for i, (key, res) in enumerate(zip(keys, done, strict=True)):
            results[key] = res
            if progress and ((i + 1) % 10 == 0 or i + 1 == len(keys)):
                print(f"pshare-lora synthetic: {i + 1}/{len(keys)} fits", file=sys.stderr, flush=True)
    return results


def synthetic_part(cfg: Config, run_dir: RunDir, progress: bool) -> Part:
    """Main comparison over seeds and the theory sweeps (one pool of fits): records, claims, table, notes, plots."""
    sweep_seeds = cfg.sweep.seeds or cfg.seeds
    points = [p for pts in problems(cfg.sweep, cfg.problem).values() for _, p in pts]
    jobs = [(cfg.problem, m, s) for m in cfg.methods for s in cfg.seeds]
    jobs += [(p, m, s) for p in points for m in cfg.sweep.methods for s in sweep_seeds]
    results = run_fits(jobs, cfg.train, cfg.workers, progress)
    records, acc = [], defaultdict(lambda: defaultdict(list))
    for method in cfg.methods:
        for seed in cfg.seeds:
            res = results[cfg.problem.model_dump_json(), method, seed]
            records.append({"experiment": "main", "method": method, "seed": seed, "n_train": cfg.problem.n_train,
                            **res})
            for key, value in res.items():
                acc[method][key].append(value)
    first = acc[cfg.methods[0]]
    diversity = {k: round(float(np.mean(first[k])), 4) for k in ("nu", "sigma_tail", "bias_mean", "oracle_accuracy")}
    sweeps = sweep_part(cfg.sweep, cfg.problem, sweep_seeds, results, diversity["oracle_accuracy"], run_dir)
    metrics = {"main": {LABELS[m]: {k: round(float(np.mean(v[k])), 4) for k in ("accuracy", "param_error",
                                                                               "subspace_dist")}
                        for m, v in acc.items()}, "diversity": diversity, **sweeps.metrics}
    p = cfg.problem
    notes = [table(acc, cfg.methods, diversity["oracle_accuracy"]),
             f"Truth: nu = {diversity['nu']}, Sigma_tail = {diversity['sigma_tail']}; d1 = {p.d1}, d2 = {p.d2}, "
             f"N = {p.users}, k = {p.k}, rho = {p.rho}, eta = {p.tail}, N_p = {p.n_train}; {cfg.train.steps} "
             f"full-batch Adam steps (lr {cfg.train.lr}) per method; sweeps over seeds {sweep_seeds}.", *sweeps.notes]
    if p.depth == 1 and "share_rep" in cfg.methods:
        notes.append("With depth 1 the model has a single LoRA layer, so Share Rep has no layer below to freeze: it is "
                     "a global phase followed by per-user factors (both A and B) on that layer.")
    return Part(ordering_claims(acc) + sweeps.claims, records + sweeps.records, metrics, notes)


def run(cfg: Config, run_dir: RunDir, progress: bool = True) -> None:
    """The synthetic comparison and sweeps (skipped when `methods` is empty), then every enabled part: the §8.3
    bandit, the federated variant and the text reward models."""
    parts = [synthetic_part(cfg, run_dir, progress)] if cfg.methods else []
    if cfg.bandit.run:
        parts.append(bandit_part(cfg.bandit, cfg.problem, cfg.seeds, run_dir, progress))
    if cfg.federated.run:
        parts.append(federated_part(cfg.federated, cfg.problem, cfg.seeds, run_dir, progress))
    if cfg.text.run:
        parts.append(text_part(cfg.text, cfg.seeds, run_dir, progress))
    metrics = {k: v for part in parts for k, v in part.metrics.items()}
    run_dir.write_metrics([r for part in parts for r in part.records])
    run_dir.write_summary([c for part in parts for c in part.claims], metrics,
                          notes=[n for part in parts for n in part.notes], plot_metrics=[])
