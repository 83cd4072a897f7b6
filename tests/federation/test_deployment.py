"""A real Flower deployment on the loopback: a SuperLink with TLS and SuperNode authentication, three SuperNodes that
each hold only their own partition, and `flwr run .` of the project's app (the tiny-model quickstart job). One
SuperNode is killed (SIGKILL) mid-run: the rounds go on with the other two, the metrics name it, and once restarted it
rejoins and answers. The final adapters equal the in-process simulator's for the same seed, data and dropped rounds."""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign.app import job_config
from collabalign.experiments.quickstart.comparison import client_ids, federated_job
from collabalign.federation import simulate
from collabalign.federation.deploy import LoopbackDeployment
from collabalign.federation.engine import EngineOptions
from collabalign.methods.fedavg import FedAvg

pytestmark = pytest.mark.flower
if shutil.which("flower-superlink") is None:
    pytest.skip("flower-superlink is not on PATH (activate the project's virtual environment)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.backbone=tiny-llama", "model.targets=[q_proj, v_proj]", "data.source=synthetic",
        "data.synthetic_pairs=72", "data.max_length=24", "split.clients=3", "split.min_pairs=4", "train.rounds=5"]
RUN_CONFIG = {"overrides": "; ".join(TINY), "seed": 3, "min-replies": 2, "timeout": 30.0}
KILLED = 2  # partition (and client index) of the SuperNode that is killed once round 0 (the evaluation) is recorded


class Dropping(FedAvg):
    """FedAvg whose client fails in the (client id, round) pairs the deployment dropped: the run's in-process twin."""

    def __init__(self, base: FedAvg, drops: set[tuple[str, int]]):
        super().__init__(base.trainer, base.aggregation)
        self.drops = drops

    def client_update(self, message, client):
        if (client.cid, message.meta["round"]) in self.drops:
            raise RuntimeError("dropped in the deployment")
        return super().client_update(message, client)


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_with_a_crash(deployment: LoopbackDeployment, out: Path, deadline_s: float = 400) -> list[dict]:
    """`flwr run .`; SuperNode KILLED is killed once round 0 is recorded and restarted once it is dropped."""
    run = deployment.run(ROOT, {**RUN_CONFIG, "out": str(out)})
    killed = restarted = False
    deadline = time.monotonic() + deadline_s
    while run.poll() is None:
        assert time.monotonic() < deadline, "the run did not finish in time:\n" + deployment.log("run")
        rounds = records(out)
        if not killed and rounds:
            deployment.kill_node(KILLED)
            killed = True
        if killed and not restarted and any(r.get("dropped") for r in rounds):
            deployment.restart_node(KILLED, 3)
            restarted = True
        time.sleep(0.2)
    assert run.returncode == 0 and restarted, deployment.log("run")
    assert (out / "adapters.safetensors").exists(), deployment.log("run") + deployment.log("superlink")
    return records(out)


def test_deployment_with_tls_node_auth_and_a_crashed_node_equals_the_simulator(tmp_path):
    with LoopbackDeployment(tmp_path, env={"OMP_NUM_THREADS": "1"}) as deployment:
        deployment.start(nodes=3)
        deployment.wait_status([0, 1, 2], "online")
        metrics = run_with_a_crash(deployment, tmp_path / "out")

    assert [r["round"] for r in metrics] == list(range(6))
    drops = {(key.split("@")[0], int(key.split("@")[1])) for r in metrics for key in r.get("dropped_clients", {})}
    assert ("client2", 1) in drops  # killed after round 0: gone in round 1, named in that round's record
    assert all(rnd > 0 for _, rnd in drops)  # nobody was dropped before the crash
    assert "dropped" not in metrics[-1]  # restarted, it rejoined and answered (fraction 1: every node, every round)

    # In process, the same job (each client's pairs encoded on their own, as on its node) with the same clients
    # failing in the same rounds: identical arithmetic (same ops, one thread, the float32 parameters and the rng
    # state cross the wire exactly), so the adapters and metrics are equal bit for bit, not just to tolerance.
    cfg, seed = job_config({"config": "", "method": "fedavg-lora", **RUN_CONFIG})
    algorithm, data = federated_job(cfg, seed, own=client_ids(cfg))
    reference = simulate(Dropping(algorithm, drops), data, cfg.train.rounds, seed, progress=False,
                         options=EngineOptions(min_replies=2, batched=False))  # one by one, as the nodes
    adapters = load_file(str(tmp_path / "out" / "adapters.safetensors"))
    assert sorted(adapters) == sorted(reference.state)
    for name, value in reference.state.items():
        np.testing.assert_array_equal(adapters[name], value)
    for ours, theirs in zip(metrics, reference.metrics, strict=True):
        assert (ours["accuracy"], ours["loss"]) == (theirs["accuracy"], theirs["loss"])
        assert ours.get("dropped_clients", {}).keys() == theirs.get("dropped_clients", {}).keys()
