"""Each deployable method's job (configs/deploy/<method>.yaml with the tiny Llama, a few rounds) on the three engines:
the in-process simulator, Flower's simulation engine (Ray) and a Flower deployment on the loopback (`collabalign
deploy`: SuperLink with TLS and SuperNode authentication, one SuperNode per client, `flwr run`), the deployment in
both of Flower's isolation modes (`subprocess`: the SuperNode starts each ClientApp; `process`: a SuperExec beside
each SuperNode does). Wall seconds of each run, building the job included (the deployment's: certificates, keys,
starting every process, and building the job once more to check the node count), after one untimed warm-up run of
the simulator; the ratio to the simulator and the overhead per round over it; measured one after the other in one
process. The final adapters (a personalised method's: those its nodes saved) are checked equal across the engines
that return them.
Run: OMP_NUM_THREADS=1 PATH=.venv/bin:$PATH .venv/bin/python benchmarks/engines.py [METHOD ...]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.commands import CONFIG_DIR
from collabalign.deployment import deploy

TINY = {  # small enough to time the engines rather than the model
    "fedavg-lora": ["model=tiny-llama", "rounds=3", "max_length=32"],
    "fslora": ["model=tiny-llama", "rounds=3", "lora.rank=8", "max_length=32"],
    "firm": ["model=tiny-llama", "rounds=2", "max_new_tokens=4", "lora.blocks=1"],
    "pshare-lora-federated": ["model=tiny-llama", "rounds=3", "lora.blocks=1", "max_length=32"],
}


def config(method: str) -> Path:
    return CONFIG_DIR / "deploy" / f"{method}.yaml"


def adapters(folder: Path) -> dict[str, np.ndarray]:
    """Every saved adapter tensor of a run folder (its nodes' results included), by adapter/file/tensor."""
    return {f"{p.parent.name}/{p.name}/{k}": v for p in sorted(folder.glob("**/adapters/*/*.safetensors"))
            for k, v in load_file(str(p)).items()}


def in_process(method: str, engine: str, out: Path) -> tuple[dict[str, np.ndarray], int]:
    """The job run by the simulator on `engine`, one client after another as on the nodes: (adapters, rounds)."""
    job = jobs.build(jobs.read_spec(config(method), TINY[method]))
    job.options = job.options.model_copy(update={"engine": engine, "batched": False})
    job.run().save(out)
    return adapters(out), job.rounds


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(methods: list[str]) -> None:
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'method':<22}{'engine':<36}{'wall s':>8}{'x simulator':>13}{'overhead s/round':>18}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for method in methods:
            in_process(method, "simulator", root / f"{method}-warm")  # first imports and model build not timed
            (sim, rounds), sim_s = timed(lambda m=method: in_process(m, "simulator", root / f"{m}-sim"))
            (flower, _), flower_s = timed(lambda m=method: in_process(m, "flower", root / f"{m}-flower"))
            nodes = len(jobs.build(jobs.read_spec(config(method), TINY[method])).clients)
            rows, engines = [("in-process simulator", sim_s), ("Flower simulation (Ray)", flower_s)], [flower]
            for isolation in ("subprocess", "process"):
                out = root / f"{method}-deploy-{isolation}"
                _, deploy_s = timed(lambda m=method, n=nodes, o=out, i=isolation: deploy(
                    config(m), TINY[m], n, o, progress=False, isolation=i))
                rows.append((f"loopback deployment ({isolation})", deploy_s))
                engines.append(adapters(out))
            for name, seconds in rows:
                print(f"{method:<22}{name:<36}{seconds:8.1f}{seconds / sim_s:13.1f}"
                      f"{(seconds - sim_s) / rounds:18.1f}")
            returned = [other for other in engines if other]  # Ray's nodes keep no personal models
            same = all(sorted(other) == sorted(sim) and all(np.array_equal(sim[k], other[k]) for k in sim)
                       for other in returned)
            print(f"{method:<22}final adapters equal on the {len(returned) + 1} engines returning them: "
                  f"{'yes' if same else 'NO'}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(TINY))
