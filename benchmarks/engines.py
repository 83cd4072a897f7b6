"""One FedAvg-LoRA job (the quickstart with the tiny Llama: 4 clients, 3 rounds, synthetic pairs) on the three engines:
the in-process simulator, Flower's simulation engine (Ray) and a Flower deployment on the loopback (SuperLink with TLS
and SuperNode authentication, 4 SuperNodes, `flwr run .`). Wall seconds of each run, building the job included, after
one untimed warm-up run (the deployment's start-up until its SuperNodes are online is printed apart), and the ratio to
the simulator, measured one after the other in one process; the final adapters are checked equal across the three.
Run: OMP_NUM_THREADS=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PATH=.venv/bin:$PATH \
     .venv/bin/python benchmarks/engines.py
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from collabalign.app import job_config
from collabalign.comm import Params
from collabalign.experiments.quickstart.comparison import client_ids, federated_job
from collabalign.federation import simulate
from collabalign.federation.deploy import LoopbackDeployment
from collabalign.federation.engine import EngineOptions

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj, v_proj]", "data.source=synthetic",
        "data.synthetic_pairs=96", "data.max_length=24", "split.clients=4", "split.min_pairs=4", "train.rounds=3"]
RUN_CONFIG = {"overrides": "; ".join(TINY), "seed": 0}


def in_process(engine: str) -> Params:
    """The job run by `simulate` on `engine`, every client's pairs encoded on their own (as on a node)."""
    cfg, seed = job_config({"config": "", "method": "fedavg-lora", **RUN_CONFIG})
    algorithm, data = federated_job(cfg, seed, own=client_ids(cfg))
    options = EngineOptions(engine=engine, batched=False)  # one client after another, as on the nodes: equal bits
    return simulate(algorithm, data, cfg.train.rounds, seed, progress=False, options=options).state


def deployed(folder: Path) -> tuple[Params, float, float]:
    """The job on a loopback deployment: (final adapters, start-up seconds, run seconds)."""
    start = time.perf_counter()
    with LoopbackDeployment(folder, env={"OMP_NUM_THREADS": "1"}) as deployment:
        deployment.start(nodes=4)
        deployment.wait_status([0, 1, 2, 3], "online")
        ready = time.perf_counter()
        run = deployment.run(ROOT, {**RUN_CONFIG, "out": str(folder / "out")})
        if run.wait(timeout=900) != 0:
            raise RuntimeError(deployment.log("run"))
        done = time.perf_counter()
    return load_file(str(folder / "out" / "adapters.safetensors")), ready - start, done - ready


def timed(fn) -> tuple[Params, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    in_process("simulator")  # warm-up: first imports, tokenizer and model construction are not timed
    sim, sim_s = timed(lambda: in_process("simulator"))
    flower, flower_s = timed(lambda: in_process("flower"))
    with tempfile.TemporaryDirectory() as folder:
        deploy, startup_s, deploy_s = deployed(Path(folder))
    same = all(np.array_equal(sim[k], other[k]) for other in (flower, deploy) for k in sim)
    print(f"FedAvg-LoRA, tiny Llama, 4 clients x 3 rounds; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"{'engine':<34}{'wall s':>8}{'x simulator':>13}")
    for name, seconds in [("in-process simulator", sim_s), ("Flower simulation (Ray)", flower_s),
                          ("loopback deployment (flwr run)", deploy_s)]:
        print(f"{name:<34}{seconds:8.1f}{seconds / sim_s:13.1f}")
    print(f"deployment start-up (SuperLink + 4 SuperNodes online, not counted above): {startup_s:.1f} s")
    print(f"final adapters equal on all three engines: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
