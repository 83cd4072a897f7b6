"""Federated P-ShareLoRA (beyond the paper): users as clients of the Algorithm protocol on the §8.1 bilinear problem,
against FedAvg-LoRA (the project's `FedAvg` over the same routed-LoRA trainer), LoRA-local and the centralised
P-ShareLoRA (SI) / LoRA-global given the same number of gradient steps per user (rounds × H) on the same data; the
simulator's ledger, and a byte-exact check of the upload."""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
from torch import nn

from collabalign.claims import equivalence, exact, not_run, superiority
from collabalign.comm import Ledger, Message
from collabalign.experiments.pshare_lora.config import Config, FederatedConfig
from collabalign.experiments.pshare_lora.plots import federated_plot
from collabalign.experiments.pshare_lora.problems.synthetic import (
    ProblemConfig,
    TrainConfig,
    Truth,
    evaluate,
    fit_model,
    generate,
    model_for,
)
from collabalign.federation import SimulationResult, simulate
from collabalign.federation.simulator import sample_clients
from collabalign.lora import lora_layers
from collabalign.methods.fedavg import FedAvg
from collabalign.methods.pshare_lora.federated import (
    FederatedPShareLoRA,
    LocalLoRA,
    PersonalLoRA,
    personal_bytes,
    user_data,
)
from collabalign.methods.pshare_lora.local_trainer import LocalSteps, RoutedLoRA
from collabalign.methods.pshare_lora.train import Prefs
from collabalign.runs import Part, RunDir, cached_json, fingerprint
from collabalign.seeding import Seeds

FEDERATED = ("fed_pshare_si", "fed_pshare_wu", "fed_pshare_g", "fedavg_lora", "fed_local")
CENTRAL = {"central_pshare_si": "pshare_si", "central_global": "global"}
LABELS = {"fed_pshare_si": "federated P-ShareLoRA (SI)", "fed_pshare_wu": "federated P-ShareLoRA (WU)",
          "fed_pshare_g": "federated P-ShareLoRA (G)", "fedavg_lora": "FedAvg-LoRA",
          "fed_local": "LoRA-local (federated)",
          "central_pshare_si": "centralised P-ShareLoRA (SI)", "central_global": "centralised LoRA-global"}
COLUMNS = ("accuracy", "param_error", "subspace_dist", "up_bytes_per_round", "down_bytes_per_round",
           "personal_bytes_on_clients")

BEATS_FEDAVG = superiority("federated P-ShareLoRA (SI) > FedAvg-LoRA", "held-out accuracy (fraction), paired over "
                           "seeds: federated SI above FedAvg-LoRA")
MATCHES_CENTRAL = equivalence(
    "federated P-ShareLoRA (SI) matches centralised P-ShareLoRA (SI)", "held-out accuracy (fraction), paired over "
    "seeds: federated SI within ±federated.equivalence_band (0.01 = 1 point, fixed before the first run) of "
    "centralised SI with the same steps per user, two-sided", margin=FederatedConfig().equivalence_band)
UPLOAD_IS_B = exact(
    "the upload per round is exactly the shared B factors' bytes", "runs with any personal-phase round whose ledger "
    "upload differs from the sum over sampled clients of the wire size of a Message holding every layer's B and the "
    "sample count (built from shapes): none")


def build(method: str, cfg: FederatedConfig, p: ProblemConfig, truth: Truth, clients: dict[str, Any],
          max_norm: float | None) -> FedAvg | PersonalLoRA:
    """The federated algorithm `method` on the bilinear model of `truth`."""
    trainer = RoutedLoRA(partial(model_for, truth, p.k, p.depth),
                         LocalSteps(cfg.local_steps, cfg.lr, cfg.optimizer, cfg.batch_size), max_norm,
                         [c["test"] for c in clients.values()])
    if method == "fed_pshare_si":
        return FederatedPShareLoRA(trainer)
    if method == "fed_pshare_wu":
        return FederatedPShareLoRA(trainer, round(cfg.warmup_fraction * cfg.rounds))
    if method == "fed_pshare_g":
        return FederatedPShareLoRA(trainer, round(cfg.global_fraction * cfg.rounds), cfg.lr / 3)
    if method == "fedavg_lora":
        return FedAvg(trainer)
    if method == "fed_local":
        return LocalLoRA(trainer)
    raise ValueError(f"unknown federated method {method!r}; known: {', '.join((*FEDERATED, *CENTRAL))}")


def expected_upload(truth: Truth, cfg: FederatedConfig, p: ProblemConfig, seed: int, clients: dict[str, Any],
                    personal_from: int) -> dict[int, int]:
    """Upload bytes per round if each sampled client sends exactly every layer's B (zeros of B's shape: the wire
    size depends on shapes only) and its sample count, from round `personal_from` on: built from the model's
    shapes and the simulator's sampling, not from the algorithm's messages."""
    shared = {f"{name}.B": np.zeros(tuple(layer.B.shape), np.float32)
              for name, layer in lora_layers(model_for(truth, p.k, p.depth)).items()}
    ids = list(clients)
    return {r: sum(Message(shared, {"n": len(clients[cid]["train"])}).nbytes
                   for cid in sample_clients(Seeds(seed), r, ids, cfg.fraction))
            for r in range(personal_from, cfg.rounds + 1)}


def final_model(algorithm: FedAvg | PersonalLoRA, result: SimulationResult, rounds: int) -> nn.Module:
    """The centralised-shaped model after the run: FedAvg's one model, or every user's own stacked by user."""
    if isinstance(algorithm, FedAvg):
        return algorithm.trainer.assemble(result.state)
    return algorithm.assemble(result.state, result.clients, rounds)


def run_federated(method: str, config: Config, seed: int, problem: tuple[Truth, Prefs, Prefs],
                  max_norm: float | None, progress: bool) -> tuple[dict, SimulationResult]:
    """Simulates `method` on `config.engine` and measures it with the centralised metrics on a centralised-shaped
    model."""
    cfg, p = config.federated, config.problem
    truth, data, test = problem
    clients = user_data(data, test, p.users)
    algorithm = build(method, cfg, p, truth, clients, max_norm)
    result = simulate(algorithm, clients, cfg.rounds, seed, cfg.fraction, cfg.eval_every, options=config.engine,
                      progress=progress, label=f"{method} seed {seed}")
    res = evaluate(final_model(algorithm, result, cfg.rounds), truth, test)
    per_round = result.ledger.per_round()
    shared = algorithm.shared if isinstance(algorithm, PersonalLoRA) else list(algorithm.trainer.kinds)
    params = result.state["params"] if isinstance(algorithm, PersonalLoRA) else result.state
    res.update({"up_bytes_total": result.ledger.total("up"), "down_bytes_total": result.ledger.total("down"),
                "up_bytes_per_round": float(np.mean([b["up"] for b in per_round.values()])),
                "down_bytes_per_round": float(np.mean([b["down"] for b in per_round.values()])),
                "personal_bytes_on_clients": personal_bytes(result.clients),
                "upload_array_bytes": sum(params[n].nbytes for n in shared),
                "accuracy_by_round": {m["round"]: round(m["accuracy"], 4) for m in result.metrics}})
    if isinstance(algorithm, FederatedPShareLoRA):
        want = expected_upload(truth, cfg, p, seed, clients, algorithm.global_rounds + 1)
        res["upload_byte_exact"] = all(per_round[r]["up"] == b for r, b in want.items())
    return res, result


def run_central(method: str, cfg: FederatedConfig, p: ProblemConfig, seed: int,
                problem: tuple[Truth, Prefs, Prefs]) -> dict:
    """The centralised `method` (pshare_si / global) with rounds * H steps on the pooled data of the same seed."""
    truth, data, test = problem
    tc = TrainConfig(steps=cfg.rounds * cfg.local_steps, lr=cfg.lr, batch_size=cfg.batch_size * p.users,
                     norm_projection=cfg.norm_projection, norm_slack=cfg.norm_slack)
    net, _ = fit_model(truth, data, p, tc, method, Seeds(seed).torch(f"train-{method}"))
    raw = 2 * data.chosen.numel() * data.chosen.element_size()
    return {**evaluate(net, truth, test), "up_bytes_total": raw, "down_bytes_total": 0, "up_bytes_per_round": 0.0,
            "down_bytes_per_round": 0.0, "personal_bytes_on_clients": 0}


def claims_for(acc: dict[str, dict[str, list]], cfg: FederatedConfig) -> list[dict]:
    """Federated SI > FedAvg-LoRA; federated SI equivalent to centralised SI; upload = the B factors' bytes."""
    a = {m: v["accuracy"] for m, v in acc.items()}
    out = []
    for c, other in ((BEATS_FEDAVG, "fedavg_lora"), (replace(MATCHES_CENTRAL, margin=cfg.equivalence_band),
                                                     "central_pshare_si")):
        if "fed_pshare_si" in a and other in a:
            means = {LABELS[m]: np.mean(a[m]) for m in ("fed_pshare_si", other)}
            out.append(c.decide(a["fed_pshare_si"], a[other], mean_accuracy=means))
        else:
            out.append(not_run(c, f"needs {LABELS['fed_pshare_si']} and {LABELS[other]} in the methods"))
    runs = {m: v["upload_byte_exact"] for m, v in acc.items() if "upload_byte_exact" in v}
    if not runs:
        return [*out, not_run(UPLOAD_IS_B, "no federated P-ShareLoRA run")]
    wrong = sum(not ok for v in runs.values() for ok in v)
    return [*out, UPLOAD_IS_B.decide(wrong, 0, byte_exact_runs={LABELS[m]: f"{sum(v)}/{len(v)}" for m, v in
                                                                 runs.items()},
                                     upload_array_bytes=acc[next(iter(runs))]["upload_array_bytes"][0])]


def table(acc: dict[str, dict[str, list]], methods: list[str]) -> str:
    """Markdown table: mean ± std over seeds, one row per method."""
    lines = ["Federated comparison (mean ± std over seeds):", "", "| method | " + " | ".join(COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for m in methods:
        cells = [f"{np.mean(acc[m][c]):.4g} ± {round(float(np.std(acc[m][c])), 6):.2g}" for c in COLUMNS]
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_method(method: str, config: Config, seed: int, progress: bool) -> dict:
    """One method on one seed's problem: its metrics ("res") and, for a federated one, its ledger's rows."""
    cfg, p = config.federated, config.problem
    problem = generate(p, seed)
    if method in CENTRAL:
        return {"res": run_central(CENTRAL[method], cfg, p, seed, problem)}
    delta = problem[0].delta
    max_norm = cfg.norm_slack * float(delta.flatten(1).norm(dim=1).max()) if cfg.norm_projection else None
    res, result = run_federated(method, config, seed, problem, max_norm, progress)
    return {"res": res, "ledger": result.ledger.rows}


def cache_key(config: Config) -> str:
    """The fingerprint every (method, seed) run is cached under (as in results/pshare-main): the federated section
    less the run selection, with the top-level engine inside it, and the problem."""
    federated = config.federated.model_dump(mode="json", exclude={"run", "methods"})
    return fingerprint({"federated": {**federated, "engine": config.engine.model_dump(mode="json")},
                        "problem": config.problem.model_dump(mode="json")})


def federated_part(config: Config, run_dir: RunDir, progress: bool) -> Part:
    """Every method on the main problem's data per seed: records, claims, table, the first seed's ledgers and an
    accuracy plot. Each (method, seed) is cached in run_dir/pshare_federated_runs, so a stopped run continues."""
    cfg, p, seeds = config.federated, config.problem, config.seeds
    unknown = [m for m in cfg.methods if m not in FEDERATED and m not in CENTRAL]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; known: {', '.join((*FEDERATED, *CENTRAL))}")
    acc: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    records, ledgers = [], {}
    key = cache_key(config)
    for seed in seeds:
        for method in cfg.methods:
            saved = cached_json(run_dir.path / "pshare_federated_runs" / f"{method}__seed{seed}.json", key,
                                partial(run_method, method, config, seed, progress))
            res = saved["res"]
            if "accuracy_by_round" in res:  # rounds back from JSON's string keys
                res["accuracy_by_round"] = {int(r): a for r, a in res["accuracy_by_round"].items()}
            if "ledger" in saved and seed == seeds[0]:
                ledgers[method] = Ledger()
                for row in saved["ledger"]:
                    ledgers[method].record(*row)
            records.append({"experiment": "federated", "method": method, "seed": seed, **res})
            for key, value in res.items():
                acc[method][key].append(value)
            if progress:
                print(f"federated {method} seed {seed}: accuracy {res['accuracy']:.4f}", file=sys.stderr)
    run_dir.write_ledgers(ledgers)
    federated_plot(run_dir, acc, LABELS, cfg.rounds)
    metrics = {LABELS[m]: {c: round(float(np.mean(acc[m][c])), 4) for c in (*COLUMNS, "up_bytes_total",
                                                                          "down_bytes_total")} for m in cfg.methods}
    return Part(claims_for(acc, cfg), records, {"federated": metrics}, notes(acc, cfg, p))


def notes(acc: dict[str, dict[str, list]], cfg: FederatedConfig, p: ProblemConfig) -> list[str]:
    """The table and what the byte columns mean."""
    return [table(acc, cfg.methods),
            f"Federated part: d1 = {p.d1}, d2 = {p.d2}, N = {p.users} users as clients, k = {p.k}, rho = {p.rho}, "
            f"N_p = {p.n_train}; {cfg.rounds} rounds x H = {cfg.local_steps} local {cfg.optimizer} steps (lr {cfg.lr}, "
            f"fresh optimiser each round), a fraction {cfg.fraction:g} of the clients per round; the centralised "
            f"methods take {cfg.rounds * cfg.local_steps} Adam steps on the pooled data (with fraction < 1 a federated "
            "user takes fewer steps on average).",
            "Bytes are wire bytes from the simulator's ledger (safetensors with header and metadata), all clients "
            "together; personal_bytes_on_clients: the private factors that never left the clients at the end. For "
            "the centralised rows up_bytes_total is the one-off upload of the raw pairs (float32 features) that "
            "pooling the data would need."]
