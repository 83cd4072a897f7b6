"""A real Flower deployment on the loopback: a SuperLink with TLS and SuperNode authentication, three SuperNodes that
each hold only their own partition, and `flwr run` of the project's app (deploy/fedavg-lora on a tiny model) behind a
ClientApp that poisons node 1's training replies (x 1e6). One SuperNode is killed (SIGKILL) mid-run: the rounds go on
with the others and the metrics name it; node 1's replies are dropped by `engine.max_update_norm` every round. The final
adapters equal the in-process simulator's for the same seed, data and dropped replies. (A killed SuperNode restarted
with its private state: test_deployment_pshare.py.)"""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.federation import simulate
from collabalign.federation.deploy import LoopbackDeployment
from collabalign.methods.fedavg import FedAvg

pytestmark = pytest.mark.flower

TINY = ["model=tiny-llama", "rounds=2", "seed=3", "max_length=32", "engine.min_replies=1", "engine.timeout_s=10",
        "engine.max_update_norm=1000", "engine.outlier_factor=null"]
RUN_CONFIG = {"config": "", "overrides": "; ".join(TINY)}  # "": the shipped deploy/fedavg-lora.yaml
KILLED = 2  # partition (and client index) of the SuperNode that is killed once round 0 (the evaluation) is recorded
POISONED = 1  # partition of the SuperNode whose training replies the ClientApp scales by 1e6


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
    """`flwr run` of the poisoning app; SuperNode KILLED is killed once round 0 is recorded."""
    run = deployment.run(poison_app(out.parent / "poison-app"), {**RUN_CONFIG, "out": str(out)})
    killed = False
    deadline = time.monotonic() + deadline_s
    while run.poll() is None:
        assert time.monotonic() < deadline, "the run did not finish in time:\n" + deployment.log("run")
        rounds = records(out)
        if not killed and rounds:
            deployment.kill_node(KILLED)
            killed = True
        time.sleep(0.2)
    assert run.returncode == 0 and killed, deployment.log("run")
    assert (out / "manifest.json").exists(), deployment.log("run") + deployment.log("superlink")
    return records(out)


def test_deployment_with_tls_node_auth_and_a_crashed_node_equals_the_simulator(tmp_path):
    with LoopbackDeployment(tmp_path, env={"OMP_NUM_THREADS": "1"}, state_dir=tmp_path / "state",
                            workers=True) as deployment:
        deployment.start(nodes=3)
        metrics = run_with_a_crash(deployment, tmp_path / "out")

    assert [r["round"] for r in metrics] == list(range(3))
    drops = {(key.split("@")[0], int(key.split("@")[1])) for r in metrics for key in r.get("dropped_clients", {})}
    assert drops == {(f"client{c}", r) for c in (POISONED, KILLED) for r in (1, 2)}  # nobody dropped before the crash
    for record in metrics[1:]:  # killed after round 0: gone from round 1; poisoned: rejected for its norm
        reasons = record["dropped_clients"]
        assert "missing" in reasons[f"client{KILLED}@{record['round']}"]
        assert "rejected" in reasons[f"client{POISONED}@{record['round']}"]
        assert "norm" in reasons[f"client{POISONED}@{record['round']}"]

    # In process, the same job with the same clients failing in the same rounds: identical arithmetic (same ops, one
    # thread, the float32 parameters and the rng state cross the wire exactly), so the adapters and metrics are equal
    # bit for bit, not just to tolerance.
    job = jobs.build(jobs.read_spec(jobs.DEFAULT_CONFIG, TINY))
    options = job.options.model_copy(update={"batched": False})  # one by one, as the nodes
    reference = simulate(Dropping(job.algorithm, drops), job.clients, job.rounds, job.seed, progress=False,
                         options=options)
    expected = job.finish(reference)
    expected.save(tmp_path / "reference")
    for name in ("adapter_model.safetensors", "head.safetensors"):
        ours = load_file(str(tmp_path / "out" / "adapters" / "global" / name))
        theirs = load_file(str(tmp_path / "reference" / "adapters" / "global" / name))
        assert sorted(ours) == sorted(theirs)
        for key, value in theirs.items():
            np.testing.assert_array_equal(ours[key], value)
    for ours, theirs in zip(metrics, reference.metrics, strict=True):
        assert (ours["accuracy"], ours["loss"]) == (theirs["accuracy"], theirs["loss"])
        assert ours.get("dropped_clients", {}).keys() == theirs.get("dropped_clients", {}).keys()



POISON = """from collabalign import app
from collabalign.comm import Message
from collabalign.federation import flower_client


def handle(kind, context, round_, payload):
    reply = app.handle(kind, context, round_, payload)
    if kind == "train" and int(context.node_config["partition-id"]) == POISONED:
        message = Message.deserialise(reply)
        reply = Message({k: v * 1e6 for k, v in message.items()}, message.meta).serialise()
    return reply


client_app = flower_client.client_app(handle)
""".replace("POISONED", str(POISONED))


def poison_app(folder: Path) -> Path:
    """The project's app with a ClientApp that scales node POISONED's training replies by 1e6 (a poisoned node)."""
    from collabalign.deployment import APP_TOML

    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(APP_TOML.replace('clientapp = "collabalign.app:client_app"',
                                                            'clientapp = "poison:client_app"'))
    (folder / "poison.py").write_text(POISON)
    return folder
