"""Federated SFT and DPO of a LoRA policy over clients holding preference pairs (HH-RLHF harmless pairs split by topic,
or your JSONL): first the gate (FedAvg and centralised training against the base model), then FedAvg against the six
other server optimisers under an iid and a Dirichlet split, and quantised against float32 uploads.

Every arm of a seed shares its test pairs, its clients' split and its initial adapters; each run is cached in the run
folder (`fed_tune_runs/`), the encoded pairs in the model cache (`models.backbones.cache_dir()`/fed_tune), so a stopped
run continues where it stopped and other run folders reuse the encoding."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from collabalign.claims import Claim, confirmed, non_inferiority, not_run, superiority
from collabalign.data import PreferenceSet, attribute_labels, dirichlet, iid, load_hh_rlhf, shared_data_dir
from collabalign.data.errors import DataError
from collabalign.data.formats import load_pairs
from collabalign.data.hh_rlhf import HH_FILE
from collabalign.experiments.fed_tune.config import Config
from collabalign.experiments.fed_tune.plots import plot_scores
from collabalign.federation import simulate
from collabalign.federation.aggregation import Aggregation
from collabalign.methods.fed_tune import prompt_tokens
from collabalign.methods.fedavg import fedavg
from collabalign.methods.policy_trainer import PolicyPairs, PolicyTrainer, encode_policy_pairs
from collabalign.models.backbones import cache_dir, load_backbone
from collabalign.policy.model import Policy
from collabalign.runs import Part, RunDir, cached_json, fingerprint
from collabalign.seeding import Seeds

SPLITS = ("iid", "dirichlet")
ADAPTIVE = ("fedadagrad", "fedadam", "fedyogi")
SCORE = {"sft": "minus the held-out NLL per token (nats)", "dpo": "held-out preference accuracy (points)"}
MARGIN = {"sft": 0.01, "dpo": 2.0}  # non-inferiority margins of the quantised uploads, in the score's units


def gate_claims(objective: str) -> tuple[Claim, Claim]:
    """(federated, centralised) learned: SFT below the base model's NLL; DPO above chance and the base's ranking."""
    if objective == "sft":
        what = "per seed, the base model's held-out NLL per token minus {}'s, above 0"
        return (superiority("federated SFT is learned", what.format("FedAvg (iid)")),
                superiority("centralised SFT is learned", what.format("centralised SFT")))
    what = ("per seed, {}'s held-out preference accuracy (points) above 50 and above the base model's own ranking "
            "(log-prob of the chosen reply above the rejected's), Holm over the two")
    return (superiority("federated DPO is learned", what.format("FedAvg (iid)")),
            superiority("centralised DPO is learned", what.format("centralised DPO")))


def ranking_claims(objective: str, rules: list[str]) -> dict[str, Claim]:
    """The literature's orderings, declared before the runs (score: `SCORE[objective]`, paired by seed)."""
    score = SCORE[objective]
    out = {"heterogeneity": superiority(f"{objective}: FedAvg loses under Dirichlet", f"per seed, FedAvg's {score} "
                                        "on the iid split minus on the Dirichlet split, above 0")}
    for rule in rules:
        if rule in ("fedavgm", "fedprox", "scaffold"):
            out[rule] = superiority(f"{objective}: {rule} beats FedAvg under Dirichlet", f"per seed, {rule}'s {score} "
                                    "minus FedAvg's, Dirichlet split, above 0")
    if any(r in ADAPTIVE for r in rules):
        out["adaptive"] = superiority(f"{objective}: the adaptive server optimisers beat FedAvg under Dirichlet",
                                      f"per seed, each of FedAdagrad, FedAdam, FedYogi's {score} minus FedAvg's, "
                                      "Dirichlet split, above 0, Holm over the three")
    return out


def quantised_claim(objective: str, bits: int) -> Claim:
    return non_inferiority(f"{objective}: {bits}-bit uploads are no worse than float32",
                           f"per seed, FedAvg's {SCORE[objective]} with {bits}-bit uploads at most {MARGIN[objective]} "
                           "below float32's (iid split)", margin=MARGIN[objective])


@dataclass
class Setup:
    """What every seed shares: the policy, the kept pairs, their split labels and their encoding."""

    policy: Policy
    pairs: PreferenceSet
    labels: np.ndarray
    encoded: PolicyPairs  # chosen and (with DPO) rejected replies of every kept pair
    left_out: int  # pairs whose prompts were over max_prompt_tokens


def prepare(cfg: Config, cache: Path, progress: bool) -> Setup:
    """The pairs (HH-RLHF or JSONL), those whose prompts fit, the policy and the encoding (cached in `cache`)."""
    data, train = cfg.data, cfg.train
    if data.source == "jsonl":
        pairs = load_pairs(data.path)
    else:
        root = shared_data_dir()
        if root is None or not (root / HH_FILE).exists():
            raise DataError(HH_FILE, None, None, "the shared HH-RLHF pairs are not there (../shared/data or "
                            "$COLLABALIGN_DATA); give data.source jsonl and data.path")
        pairs = load_hh_rlhf(root / HH_FILE, drop_invalid=True)
    backbone = load_backbone(train.model)
    backbone.model.to(train.device)
    policy = Policy(backbone, list(train.targets), train.rank, train.alpha, 0.0)
    fits = [p for p in pairs.pairs if prompt_tokens(policy, p.prompt) <= data.max_prompt_tokens]
    kept = PreferenceSet(fits[:data.max_pairs], pairs.dropped, pairs.source)
    labels = attribute_labels(kept, data.split_key)  # a key some pair lacks: one DataError naming it
    objective = "dpo" if "dpo" in cfg.objectives else "sft"
    paths = {o: cache / f"pairs-{encoding_key(cfg, o, len(kept))[:16]}.pt" for o in ("sft", "dpo")}
    path = paths["dpo"] if paths["dpo"].exists() else paths[objective]  # DPO's encoding holds SFT's
    if path.exists():
        encoded = PolicyPairs(**torch.load(path, weights_only=False))
    else:
        if progress:
            print(f"fed-tune: encoding {len(kept)} pairs once ({objective})", file=sys.stderr)
        encoded = encode_policy_pairs(policy, kept.pairs, objective, data.max_prompt_tokens,
                                      data.max_response_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(vars(encoded), path.with_suffix(".part"))
        path.with_suffix(".part").replace(path)  # whole or absent: a killed run never leaves half a file
    return Setup(policy, kept, np.array(labels), encoded, len(pairs.pairs) - len(fits))


def encoding_key(cfg: Config, objective: str, pairs: int) -> str:
    """What changes the encoding: the data's cuts, the model and its adapted layers, the objective, the pairs."""
    return fingerprint({"data": cfg.data.model_dump(mode="json", exclude={"test_fraction", "split_key"}),
                        "model": cfg.train.model, "targets": cfg.train.targets, "objective": objective,
                        "pairs": pairs})


def seed_rows(cfg: Config, setup: Setup, seed: int) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]]:
    """The seed's scored pairs (the test pairs, or with `validation` a slice of the training pairs) and, per split,
    each client's training pairs."""
    perm = Seeds(seed).numpy("fed-tune/test").permutation(len(setup.labels))
    n_test = round(cfg.data.test_fraction * len(perm))
    train = np.sort(perm[n_test:])
    if cfg.validation:  # the test pairs stay unseen: score on a held-out slice of the training pairs
        inner = Seeds(seed).numpy("fed-tune/validation").permutation(len(train))
        n_val = round(cfg.data.test_fraction * len(train))
        scored, train = np.sort(train[inner[:n_val]]), np.sort(train[inner[n_val:]])
    else:
        scored = np.sort(perm[:n_test])
    n, rng = cfg.train.clients, Seeds(seed).numpy("fed-tune/clients")
    parts = {"iid": iid(len(train), n, rng),
             "dirichlet": dirichlet(setup.labels[train], n, cfg.dirichlet_alpha, rng, min_size=cfg.train.batch_size)}
    return scored, {split: {f"client{i}": train[p] for i, p in enumerate(ps)} for split, ps in parts.items()}


def objective_pairs(encoded: PolicyPairs, objective: str) -> PolicyPairs:
    """The encoding an objective trains on: SFT drops the rejected replies."""
    return encoded if objective == "dpo" else PolicyPairs(encoded.chosen, None, encoded.ref_chosen, None)


def run_arm(cfg: Config, setup: Setup, objective: str, seed: int, arm: str) -> dict:
    """One arm of one seed: its final held-out metrics, upload bytes and seconds. Arms: base, centralised,
    `<split>/<optimizer>` and `iid/fedavg-<bits>bit`."""
    train, start = cfg.train, time.perf_counter()
    scored, clients = seed_rows(cfg, setup, seed)
    pairs = objective_pairs(setup.encoded, objective)
    steps = train.local_steps * (train.clients if arm == "centralised" else 1)
    trainer = PolicyTrainer(setup.policy, objective, pairs[scored], train.lr, steps, train.batch_size, train.beta)
    if arm == "base":
        return trainer.evaluate(trainer.initial_params(Seeds(seed)))  # DPO: `ranking` is the base model's own
    split, _, rule = arm.partition("/")
    bits = int(rule.split("-")[1].removesuffix("bit")) if rule.startswith("fedavg-") else None
    opt = cfg.optimizers["fedavg" if bits else rule or "fedavg"]
    data = ({"central": np.sort(np.concatenate(list(clients["iid"].values())))} if arm == "centralised"
            else clients[split])
    engine = cfg.engine.model_copy(update={"upload_bits": bits}) if bits else cfg.engine
    algorithm = fedavg(trainer, Aggregation(), opt, clients=len(data))
    result = simulate(algorithm, {c: pairs[rows] for c, rows in data.items()}, train.rounds, seed,
                      eval_every=train.rounds, options=engine, progress=False, label=f"{objective} {arm} seed {seed}")
    final = {k: v for k, v in result.metrics[-1].items() if k != "round"}
    return final | {"up_bytes": result.ledger.total("up"), "seconds": round(time.perf_counter() - start, 1)}


def arms(cfg: Config) -> list[str]:
    return (["base", "centralised"] + [f"{s}/{r}" for s in SPLITS for r in cfg.optimizers
                                       if s == "dirichlet" or r == "fedavg" or cfg.others_on_iid]
            + [f"iid/fedavg-{b}bit" for b in cfg.upload_bits])


def score(objective: str, metrics: dict) -> float:
    """Higher is better: minus the NLL per token for SFT, accuracy in points for DPO."""
    return -metrics["nll"] if objective == "sft" else 100 * metrics["accuracy"]


def comparison_part(cfg: Config, run_dir: RunDir, progress: bool = True) -> Part:
    """Every arm of every objective and seed (cached), then the gate and, where it holds, the orderings."""
    setup = prepare(cfg, cache_dir() / "fed_tune", progress)
    which = {"seeds", "objectives", "others_on_iid"}  # which arms run, not what any arm computes
    settings = {"cfg": cfg.model_dump(mode="json", exclude=which), "pairs": len(setup.labels)}
    results, records = {}, []
    for objective in cfg.objectives:
        for seed in cfg.seeds:
            for arm in arms(cfg):
                key = fingerprint(settings | {"objective": objective, "seed": seed, "arm": arm})
                path = run_dir.path / "fed_tune_runs" / f"{objective}-{arm.replace('/', '_')}-seed{seed}.json"
                if progress:
                    print(f"fed-tune: {objective} {arm} seed {seed}", file=sys.stderr)
                out = cached_json(path, key, lambda o=objective, s=seed, a=arm: run_arm(cfg, setup, o, s, a))
                results[objective, arm, seed] = out
                records.append({"objective": objective, "arm": arm, "seed": seed, **out})
    claims, table = [], {}
    for objective in cfg.objectives:
        per = {arm: np.array([score(objective, results[objective, arm, s]) for s in cfg.seeds]) for arm in arms(cfg)}
        table[objective] = {arm: round(float(v.mean()), 4) for arm, v in per.items()}
        # DPO's second floor: the base model's own log-prob ranking of the pairs, per seed (points)
        ranking = 100 * np.array([results[objective, "base", s]["ranking"] for s in cfg.seeds]) \
            if objective == "dpo" else None
        plot_scores(run_dir.path / "plots" / f"{objective}_scores.png", per, list(cfg.optimizers), cfg.upload_bits,
                    SCORE[objective], f"{objective.upper()}: {len(cfg.seeds)} seeds, mean and sd",
                    None if ranking is None else float(ranking.mean()))
        claims += decide(cfg, objective, per, ranking)
    metrics = {"mean_score": table, "pairs": len(setup.labels), "long_prompts_left_out": setup.left_out,
               "scored": "validation slice of the training pairs" if cfg.validation else "test pairs",
               "dpo_own_ranking": {a: round(float(np.mean([results["dpo", a, s]["ranking"] for s in cfg.seeds])), 4)
                                   for a in arms(cfg)} if "dpo" in cfg.objectives else None,
               "up_bytes_seed0": {o: {a: results[o, a, cfg.seeds[0]].get("up_bytes") for a in arms(cfg)}
                                  for o in cfg.objectives},
               "seconds": {f"{o}/{a}": round(float(np.sum([results[o, a, s].get("seconds", 0) for s in cfg.seeds])), 1)
                           for o in cfg.objectives for a in arms(cfg)}}
    t = cfg.train
    notes = [f"{t.model} with rank-{t.rank} LoRA on {list(t.targets)}; {t.clients} clients, {t.rounds} rounds x "
             f"{t.local_steps} AdamW steps of {t.batch_size} pairs at lr {t.lr} (centralised: {t.clients} x the steps "
             f"on all training pairs); DPO beta {t.beta}; Dirichlet({cfg.dirichlet_alpha}) over "
             f"`{cfg.data.split_key}`; {len(setup.labels)} pairs, replies cut at {cfg.data.max_response_tokens} "
             f"tokens; scores: SFT {SCORE['sft']}, DPO {SCORE['dpo']}."]
    return Part(claims, records, metrics, notes)


def decide(cfg: Config, objective: str, per: dict[str, np.ndarray], ranking: np.ndarray | None) -> list[dict]:
    """The gate (DPO: also above `ranking`, the base model's own), then (only where FedAvg's is reproduced) the
    orderings and the quantised uploads."""
    fed_gate, central_gate = gate_claims(objective)
    base = per["base"]
    if objective == "sft":
        gate = [fed_gate.decide(per["iid/fedavg"], base), central_gate.decide(per["centralised"], base)]
    else:
        gate = [claim.decide_cells({"chance": (per[arm], 50.0), "base ranking": (per[arm], ranking)})
                for claim, arm in ((fed_gate, "iid/fedavg"), (central_gate, "centralised"))]
    rankings = ranking_claims(objective, list(cfg.optimizers))
    later = [*rankings.values()] + [quantised_claim(objective, b) for b in cfg.upload_bits]
    if not confirmed(gate[0]):
        return gate + [not_run(c, f"federated {objective.upper()} is not shown learned (the gate)") for c in later]
    fedavg_d = per["dirichlet/fedavg"]
    out = gate + [rankings["heterogeneity"].decide(per["iid/fedavg"], fedavg_d)]
    out += [rankings[r].decide(per[f"dirichlet/{r}"], fedavg_d) for r in ("fedavgm", "fedprox", "scaffold")
            if r in rankings]
    if "adaptive" in rankings:
        cells = {r: (per[f"dirichlet/{r}"], fedavg_d) for r in ADAPTIVE if r in cfg.optimizers}
        out.append(rankings["adaptive"].decide_cells(cells))
    out += [quantised_claim(objective, b).decide(per[f"iid/fedavg-{b}bit"], per["iid/fedavg"])
            for b in cfg.upload_bits]
    return out
