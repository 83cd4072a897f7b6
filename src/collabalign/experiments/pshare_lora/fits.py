"""Every synthetic fit of the main comparison and the §8.2 sweeps, each distinct (problem, method, seed) once, on
worker processes (each fit is seeded on its own, so the results do not depend on the number of workers), each cached
in the run folder (pshare_synthetic_fits/) so a stopped run continues where it stopped."""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from multiprocessing import get_context
from pathlib import Path

from collabalign.experiments.pshare_lora.config import Config
from collabalign.experiments.pshare_lora.problems.synthetic import (
    ProblemConfig,
    TrainConfig,
    evaluate,
    fit_model,
    generate,
)
from collabalign.experiments.pshare_lora.sweeps import problems
from collabalign.runs import RunDir, cached_json, fingerprint, read_cached
from collabalign.seeding import Seeds

Fits = dict[tuple[str, str, int], dict]  # (problem JSON, method, seed) -> held-out metrics


def fit(problem: ProblemConfig, tc: TrainConfig, method: str, seed: int) -> dict:
    """Trains `method` on the problem drawn from `seed` and returns its held-out metrics."""
    truth, data, test = generate(problem, seed)
    net, losses = fit_model(truth, data, problem, tc, method, Seeds(seed).torch(f"train-{method}"))
    return {**evaluate(net, truth, test), "train_loss": round(losses[-1], 6), **truth.diversity(problem.k)}


def fit_path(folder: Path, problem: ProblemConfig, method: str, seed: int) -> Path:
    """Where `cached_fit` saves a fit (under the fingerprint of the training settings, `train_key`)."""
    return folder / f"{method}__seed{seed}__{fingerprint(problem.model_dump(mode='json'))}.json"


def cached_fit(folder: Path, problem: ProblemConfig, tc: TrainConfig, method: str, seed: int) -> dict:
    """`fit`, saved in `folder` under the problem's and the training's settings (read back when saved before)."""
    return cached_json(fit_path(folder, problem, method, seed), train_key(tc), lambda: fit(problem, tc, method, seed))


def train_key(tc: TrainConfig) -> str:
    """The fingerprint a fit is saved under: its training settings."""
    return fingerprint(tc.model_dump(mode="json"))


def jobs(cfg: Config) -> list[tuple[ProblemConfig, str, int]]:
    """The main comparison's fits, then every sweep point's."""
    points = [p for pts in problems(cfg.sweep, cfg.problem).values() for _, p in pts]
    out = [(cfg.problem, m, s) for m in cfg.methods for s in cfg.seeds]
    return out + [(p, m, s) for p in points for m in cfg.sweep.methods for s in cfg.sweep_seeds()]


def run_fits(cfg: Config, run_dir: RunDir, progress: bool) -> Fits:
    """Every distinct fit of `jobs(cfg)` once, in order, on `cfg.workers` processes (cached in the run folder)."""
    keys = list(dict.fromkeys((p.model_dump_json(), m, s) for p, m, s in jobs(cfg)))
    folder = run_dir.path / "pshare_synthetic_fits"
    folder.mkdir(parents=True, exist_ok=True)
    args = [(folder, ProblemConfig.model_validate_json(p), cfg.train, m, s) for p, m, s in keys]
    saved = [read_cached(fit_path(f, p, m, s), train_key(tc)) for f, p, tc, m, s in args]  # None: still to fit
    todo = [a for a, r in zip(args, saved, strict=True) if r is None]
    results = {}
    parallel = cfg.workers > 1 and todo  # a rerun that only reads fits back starts no worker processes
    workers = ProcessPoolExecutor(cfg.workers, mp_context=get_context("spawn")) if parallel else nullcontext()
    with workers as pool:
        fresh = (pool.map if pool else map)(cached_fit, *zip(*todo, strict=True)) if todo else iter(())
        for i, (key, res) in enumerate(zip(keys, saved, strict=True)):
            results[key] = res if res is not None else next(fresh)
            if progress and ((i + 1) % 10 == 0 or i + 1 == len(keys)):
                print(f"pshare-lora synthetic: {i + 1}/{len(keys)} fits", file=sys.stderr, flush=True)
    return results
