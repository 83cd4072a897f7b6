"""Many clients per round: one round of FedAvg-LoRA with every client's local steps in one batched computation
(`client_update_many`: stacked adapters and heads) against the same round one client after another, and against
Flower's simulation engine (Ray), in one process after an untimed warm-up of each; the final adapters are checked
close. Part 1: 32 clients, SmolLM2-135M-Instruct with LoRA on q/v of its top block, HH-RLHF harmless pairs
(the quickstart's data: its first 800 pairs, 48 tokens; the top block runs its query, MLP and norms at the
last real token only, its keys' and values' frozen projections cached with the texts, `models/last_token.py`).
Part 2: rounds per second at 1,000 clients of the tiny Llama on synthetic pairs, batched and one by one; and the
local-only baseline's exchange on the same clients (its per-client evaluation left out). Part 3: peak RSS of one
batched round at 1, 100 and 1,000 clients, each in a fresh process (the base model once plus N adapters, and the
clients' cached data).
Goals (issue 17): batched >= 5x one by one and >= 3x Flower at 32 clients. On a GPU: gpu_configs.py's engine part.
Run: OMP_NUM_THREADS=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PATH=.venv/bin:$PATH \
     .venv/bin/python benchmarks/engine_many.py [--part smollm2|tiny|all]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from collabalign.commands import CONFIG_DIR, load_config
from collabalign.experiments.quickstart.comparison import federated_job
from collabalign.federation import simulate
from collabalign.federation.engine import EngineOptions, InProcess
from collabalign.federation.protocol import ClientContext
from collabalign.methods.fedavg import LocalOnly
from collabalign.seeding import Seeds

SMOLLM2 = ["model.backbone=smollm2-135m", "model.targets=[q_proj, v_proj]", "model.lora_blocks=1",
           "data.max_pairs=800", "data.max_length=48", "split.clients=32", "split.min_pairs=8",
           "train.rounds=1"]  # 640 training pairs, about 20 a client; encoding them (untimed) takes minutes
TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj, v_proj]", "data.source=synthetic",
        "data.synthetic_pairs=20000", "data.max_length=24", "split.clients=1000", "split.min_pairs=4",
        "split.alpha=100", "train.rounds=2"]  # about 16 of the 16,000 training pairs each: one step
REPEATS = 2  # timed runs of each engine, interleaved: the best counts
ENGINES = {"batched": EngineOptions(), "one by one": EngineOptions(batched=False),
           "Flower simulation": EngineOptions(engine="flower")}


def quickstart(overrides: list[str]):
    """The quickstart's main config with `overrides` (validated; Flower is not imported: the GPU run has none)."""
    return load_config(CONFIG_DIR / "quickstart" / "main.yaml", overrides)[2]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rounds(overrides: list[str], engines: list[str]) -> dict[str, tuple[dict, float]]:
    """Per engine: (final adapters, seconds per round: the exchange and the aggregation, not the evaluation; the
    best of REPEATS runs, the engines interleaved), the job built once and untimed, each engine warmed up."""
    cfg, seed = quickstart(overrides), 0
    algorithm, data = federated_job(cfg, seed)
    for name in engines:
        simulate(algorithm, data, 1, seed, progress=False, options=ENGINES[name])  # warm-up
    out: dict[str, tuple[dict, float]] = {}
    for _ in range(REPEATS):
        for name in engines:
            result = simulate(algorithm, data, cfg.train.rounds, seed, progress=False, options=ENGINES[name])
            seconds = float(np.mean([t["client_s"] + t["server_s"] for t in result.timing]))
            out[name] = (result.state, min(seconds, out.get(name, ({}, float("inf")))[1]))
    return out


def local_only(overrides: list[str]) -> None:
    """Round 1's exchange of the local-only baseline (each client trains its own model from the broadcast) through
    the engine, batched and one by one, interleaved, best of REPEATS; the clients' models compared."""
    cfg, seed = quickstart(overrides), 0
    federated, data = federated_job(cfg, seed)
    algorithm = LocalOnly(federated.trainer)
    messages = algorithm.configure(algorithm.init(Seeds(seed)), 1, list(data))
    seconds, models = {}, {}
    for batched in [True, False] * REPEATS:
        clients = {cid: ClientContext(cid, d) for cid, d in data.items()}
        start = time.perf_counter()
        InProcess(algorithm, clients, seed, batched=batched).exchange(1, messages)
        seconds[batched] = min(seconds.get(batched, float("inf")), time.perf_counter() - start)
        models[batched] = [c.state for c in clients.values()]
    diff = max(float(np.abs(a[k] - b[k]).max()) for a, b in zip(*models.values(), strict=True) for k in a
               if k != "head.bias")
    batched, one = seconds[True], seconds[False]
    print(f"\nLocal-only, {len(data):,} clients, round 1's exchange (best of {REPEATS}): batched {batched:.2f} s, "
          f"one by one {one:.2f} s, {one / batched:.2f}x; max |diff| of the clients' models {diff:.2e} (float32: "
          "Adam's first step normalises rounding noise of near-zero gradients)")


def report(title: str, runs: dict[str, tuple[dict, float]]) -> None:
    base, base_s = runs["batched"]
    print(f"\n{title} (best of {REPEATS}); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'engine':<22}{'s / round':>11}{'rounds / s':>12}{'x batched':>11}{'max |diff| vs batched':>24}")
    for name, (state, seconds) in runs.items():
        diff = max(float(np.abs(state[k] - base[k]).max()) for k in base if k != "head.bias")
        print(f"{name:<22}{seconds:11.2f}{1 / seconds:12.3f}{seconds / base_s:11.1f}{diff:24.2e}")
    print(f"peak RSS so far: {rss_mb():.0f} MB (the head's bias is left out of the diff: it cancels in the BT loss)")


def memory(clients: int) -> None:
    """One batched round of the tiny job with `clients` clients (about 16 pairs each) in this process: the RSS before
    the round (imports, model, the clients' cached data) and the peak during it."""
    overrides = [o for o in TINY if not o.startswith(("split.clients", "data.synthetic_pairs"))]
    overrides += [f"split.clients={clients}", f"data.synthetic_pairs={20 * clients}", "train.rounds=1"]
    cfg, seed = quickstart(overrides), 0
    algorithm, data = federated_job(cfg, seed)
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak RSS (VmHWM) restarts from the current RSS
    before = vm("VmRSS")
    simulate(algorithm, data, 1, seed, progress=False)
    print(f"{clients:>8} {before:>12.0f} {vm('VmHWM'):>10.0f}")


def vm(field: str) -> float:
    """A /proc/self/status memory field in MB."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["smollm2", "tiny", "memory", "all"], default="all")
    parser.add_argument("--clients", type=int, help="(internal) one memory measurement in this process")
    args = parser.parse_args()
    if args.clients is not None:
        return memory(args.clients)
    part = args.part
    if part in ("smollm2", "all"):
        report("FedAvg-LoRA, SmolLM2-135M-Instruct, 32 clients, one round",
               rounds(SMOLLM2, ["batched", "one by one", "Flower simulation"]))
    if part in ("tiny", "all"):
        report("FedAvg-LoRA, tiny Llama, 1,000 clients", rounds(TINY, ["batched", "one by one"]))
        local_only(TINY)
    if part in ("memory", "all"):
        print("\nRSS of one batched round of the tiny job, each in a fresh process (MB)")
        print(f"{'clients':>8} {'before round':>12} {'peak in it':>10}")
        for clients in (1, 100, 1000):
            subprocess.run([sys.executable, __file__, "--clients", str(clients)], check=True)


if __name__ == "__main__":
    main()
