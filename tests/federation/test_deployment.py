"""Every federated method on a real Flower deployment on the loopback: a SuperLink with TLS and SuperNode
authentication, two SuperNodes that sign in with their own keys, each with a node worker and a private-state folder,
and `flwr run` of the app folder `collabalign deploy` writes (the installed package's apps). What the deployment
saves equals, bit for bit, what the in-process simulator saves on the same job with the clients trained one after
another (the same arithmetic on one thread). Two deployments serve the whole file (starting one costs more than most
runs on it), and the tests run in order:

1. Federated P-ShareLoRA is stopped mid-run: once round 1 is recorded, SuperNode 1 is killed (SIGKILL) and then the
   whole first deployment (SuperLink, ServerApp, the other SuperNodes). The second deployment, with the same state
   folders and run folder, continues from the ServerApp's checkpoint and the nodes' saved private state; each user's
   personal factors never reach the server, and each node's saved reward model equals the simulator's.
2. FSLoRA, FIRM and federated AffPCL (on two agents' arrays, uploads quantised to 8 bits) run on it; each FSLoRA
   device's rank is the one its SuperNode declares in its node config, not the config's. Meanwhile the SuperLink
   refuses three SuperNodes: one whose key was never registered, one without the CA certificate, one that talks
   plaintext.
3. FedAvg-LoRA behind a ClientApp that poisons node 1's training replies (x 1e6): round 1 drops them by
   `engine.max_update_norm`; SuperNode 1 is then killed once round 1 is recorded, and round 2 goes on with node 0, the
   metrics naming node 1 missing. Last, as it kills a node.

Two nodes, two users (ana and ben of the example pairs) for the jobs with one client per user: each node's Flower
processes (a ClientApp process per message) are most of the file's cost.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.commands import CONFIG_DIR
from collabalign.deployment import APP_TOML, write_app
from collabalign.examples import agent_arrays, preference_rows
from collabalign.federation import simulate
from collabalign.federation.deploy import CONNECTION, HOST, LoopbackDeployment, free_port, write_node_key
from collabalign.methods.fedavg import FedAvg

pytestmark = pytest.mark.flower

NODES = 2
DECLARED = {0: {"rank": 4}, 1: {"rank": 2}}  # what SuperNodes 0 and 1 declare; the config says ranks [2, 4]
PSHARE = CONFIG_DIR / "deploy" / "pshare-lora-federated.yaml"
PSHARE_TINY = ["model=tiny-llama", "lora.blocks=1", "rounds=2", "max_length=32", "engine.timeout_s=120"]
STOPPED, STOP_AFTER = 1, 1  # SuperNode 1 is killed, and the first deployment stopped, once round 1 is recorded
SMALL = {  # each method's deployment config on the tiny Llama, two clients
    "fslora": ["model=tiny-llama", "ranks=[2, 4]", "lora.rank=4", "rounds=1", "max_length=24"],
    "firm": ["model=tiny-llama", "clients=2", "rounds=1", "max_new_tokens=4", "lora.blocks=1"],
}
POISON_TINY = ["model=tiny-llama", "rounds=2", "seed=3", "max_length=32", "engine.min_replies=1",
               "engine.timeout_s=10", "engine.max_update_norm=1000", "engine.outlier_factor=null"]
POISONED = 1  # partition (and client index) of the SuperNode whose training replies the ClientApp scales by 1e6,
KILLED_AFTER = 1  # and which is killed once this round is recorded
ENV = {"OMP_NUM_THREADS": "1"}


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def saved_tensors(*folders: Path) -> dict[str, np.ndarray]:
    """Every adapter tensor and saved array under `folders` (run folders, nodes' saved results)."""
    out = {}
    for folder in folders:
        for p in sorted(folder.glob("**/adapters/*/*.safetensors")):
            out |= {f"{p.parent.name}/{p.name}/{k}": v for k, v in load_file(str(p)).items()}
        for p in sorted(folder.glob("**/arrays.safetensors")):
            out |= {f"arrays/{k}": v for k, v in load_file(str(p)).items()}
    return out


def assert_equal_tensors(deployed: dict[str, np.ndarray], simulated: dict[str, np.ndarray], what: str) -> None:
    assert sorted(deployed) == sorted(simulated) and simulated, what
    for key, value in simulated.items():
        np.testing.assert_array_equal(deployed[key], value, err_msg=f"{what} {key}")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The file's folder, with pairs.jsonl: the example pairs of two users, one per node."""
    root = tmp_path_factory.mktemp("deployment")
    rows = [r for r in preference_rows() if r["user"] in ("ana", "ben")]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


@pytest.fixture(scope="module")
def pshare_run(root) -> dict[str, str]:
    """Federated P-ShareLoRA's run config, after a first deployment ran it to round 1 and was stopped."""
    overrides = [*PSHARE_TINY, f"data={root / 'pairs.jsonl'}"]
    run_config = {"config": str(PSHARE), "overrides": "; ".join(overrides), "out": str(root / "pshare")}
    with LoopbackDeployment(root / "first", env=ENV, state_dir=root / "state", workers=True) as first:
        first.start(NODES)
        run = first.run(write_app(root / "app"), run_config)
        deadline = time.monotonic() + 300
        while STOP_AFTER not in [r["round"] for r in records(root / "pshare")]:
            assert run.poll() is None and time.monotonic() < deadline, first.log("run")
            time.sleep(0.1)
        first.kill_node(STOPPED)
    # stopped: the SuperLink with the ServerApp it ran, every SuperNode and worker
    assert max(r["round"] for r in records(root / "pshare")) < 2
    return run_config


@pytest.fixture(scope="module")
def deployment(root, pshare_run) -> Iterator[LoopbackDeployment]:
    """The second deployment, on the first one's state folders, its nodes declaring DECLARED."""
    with LoopbackDeployment(root / "second", env=ENV, state_dir=root / "state", workers=True) as second:
        second.node_settings = DECLARED
        second.start(NODES)
        yield second


def test_a_killed_node_and_a_stopped_server_resume_to_the_simulators_personal_models(root, pshare_run, deployment):
    run = deployment.run(root / "app", pshare_run, name="pshare")
    assert run.wait(timeout=600) == 0, deployment.log("pshare")
    assert [r["round"] for r in records(root / "pshare")] == [0, 1, 2]  # each round once: continued

    simulated = jobs.build(jobs.read_spec(PSHARE, pshare_run["overrides"].split("; "))).run()
    simulated.save(root / "pshare-simulated")
    results = [list((root / "state" / f"node{p}").glob("*/user*/result")) for p in range(NODES)]
    assert all(len(r) == 1 for r in results), results
    expected = saved_tensors(root / "pshare-simulated")
    assert len({k.split("/")[0] for k in expected}) == NODES
    assert_equal_tensors(saved_tensors(*(r[0] for r in results)), expected, "pshare")

    # the server never held a personal factor: its result is the shared B and score head only
    manifest = json.loads((root / "pshare" / "manifest.json").read_text())
    shared = load_file(str(root / "pshare" / "arrays.safetensors"))
    assert manifest["adapters"] == [] and shared and all(k.endswith(".B") or "head" in k for k in shared)
    assert records(root / "pshare")[-1]["accuracy"] == simulated.metrics["accuracy"]


def test_every_method_on_the_deployment_equals_the_simulator(root, deployment):
    np.savez(root / "agents.npz", **agent_arrays(agents=NODES))
    small = {**SMALL, "affpcl-federated": [f"data={root / 'agents.npz'}", "steps=2", "eval_every=2",
                                           "engine.min_replies=2", "engine.upload_bits=8"]}  # quantised uploads
    refused = start_refused_nodes(deployment, root)
    for method, overrides in small.items():
        config = CONFIG_DIR / "deploy" / f"{method}.yaml"
        run = deployment.run(root / "app", {"config": str(config), "overrides": "; ".join(overrides),
                                            "out": str(root / method)}, name=method)
        assert run.wait(timeout=600) == 0, deployment.log(method)
        simulated_as = overrides + (["ranks=[4, 2]"] if method == "fslora" else [])  # as the nodes declared
        job = jobs.build(jobs.read_spec(config, simulated_as))
        job.options = job.options.model_copy(update={"batched": False})  # one by one, as the nodes
        job.run().save(root / f"{method}-simulated")
        on_nodes = (root / "state").glob(f"node*/{jobs.job_key(jobs.read_spec(config, overrides))}/*/result")
        assert_equal_tensors(saved_tensors(root / method, *on_nodes), saved_tensors(root / f"{method}-simulated"),
                             method)
    assert json.loads((root / "fslora" / "manifest.json").read_text())["metrics"]["ranks"] == [4, 2]
    assert_refused(deployment, refused, root)


def start_refused_nodes(deployment: LoopbackDeployment, root: Path) -> dict:
    """Three SuperNodes the SuperLink must refuse, started beside the registered ones."""
    stranger, _ = write_node_key(root / "keys", "stranger")  # never registered
    no_ca, public = write_node_key(root / "keys", "no-ca")  # a registered key: only TLS stands in its way
    deployment.flwr("supernode", "register", str(public), CONNECTION)
    base = ["flower-supernode", "--superlink", f"{HOST}:{deployment.port}", "--max-retries", "2",
            "--max-wait-time", "20", "--node-config", "partition-id=0 num-partitions=1"]
    attempts = {
        "unregistered": [*base, "--root-certificates", str(deployment.ca), "--auth-supernode-private-key",
                         str(stranger), "--port", str(free_port())],
        "no-ca": [*base, "--auth-supernode-private-key", str(no_ca), "--port", str(free_port())],
        "plaintext": [*base, "--insecure", "--port", str(free_port())],  # no TLS (and so no node key)
    }
    return {name: deployment._spawn(name, command) for name, command in attempts.items()}


def assert_refused(deployment: LoopbackDeployment, processes: dict, root: Path) -> None:
    """Each refused SuperNode gave up with an error for its own reason; only the registered ones are online."""
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    outcome = {name: p.poll() for name, p in processes.items()}
    for p in processes.values():
        if p.poll() is None:
            p.kill()
    assert all(code not in (None, 0) for code in outcome.values()), outcome  # each gave up with an error
    logs = {name: deployment.log(name) for name in processes}
    assert "Failed to activate SuperNode" in logs["unregistered"]  # reached the SuperLink, which refused its key
    assert "certificate verify failed" in logs["no-ca"]  # could not trust the SuperLink's certificate
    assert "Connection attempt failed" in logs["plaintext"] and "Failed to activate" not in logs["plaintext"]
    nodes = deployment.flwr("supernode", "ls", CONNECTION, "--format", "json")
    assert nodes.count('"online"') == NODES  # only the registered nodes with the CA and TLS


class Dropping(FedAvg):
    """FedAvg whose client fails in the (client id, round) pairs the deployment dropped: the run's in-process twin."""

    def __init__(self, base: FedAvg, drops: set[tuple[str, int]]):
        super().__init__(base.trainer, base.aggregation)
        self.drops = drops

    def client_update(self, message, client):
        if (client.cid, message.meta["round"]) in self.drops:
            raise RuntimeError("dropped in the deployment")
        return super().client_update(message, client)


def test_a_poisoned_and_a_crashed_node_are_dropped_and_the_rest_equals_the_simulator(root, deployment):
    out, overrides = root / "poisoned", [*POISON_TINY, f"data={root / 'pairs.jsonl'}"]
    run = deployment.run(poison_app(root / "poison-app"), {"config": "", "overrides": "; ".join(overrides),
                                                           "out": str(out)}, name="poisoned")  # "": the default
    killed, deadline = False, time.monotonic() + 400
    while run.poll() is None:
        assert time.monotonic() < deadline, "the run did not finish in time:\n" + deployment.log("poisoned")
        if not killed and KILLED_AFTER in [r["round"] for r in records(out)]:
            deployment.kill_node(POISONED)
            killed = True
        time.sleep(0.2)
    assert run.returncode == 0 and killed and (out / "manifest.json").exists(), deployment.log("poisoned")
    metrics = records(out)

    assert [r["round"] for r in metrics] == [0, 1, 2]
    drops = {(key.split("@")[0], int(key.split("@")[1])) for r in metrics for key in r.get("dropped_clients", {})}
    assert drops == {(f"client{POISONED}", 1), (f"client{POISONED}", 2)}  # node 0 never dropped
    assert "rejected" in metrics[1]["dropped_clients"][f"client{POISONED}@1"]  # poisoned: rejected for its norm
    assert "norm" in metrics[1]["dropped_clients"][f"client{POISONED}@1"]
    assert "missing" in metrics[2]["dropped_clients"][f"client{POISONED}@2"]  # killed after round 1: gone

    # In process, the same job with the same clients failing in the same rounds: identical arithmetic (same ops, one
    # thread, the float32 parameters and the rng state cross the wire exactly), so the adapters and metrics are equal
    # bit for bit, not just to tolerance.
    job = jobs.build(jobs.read_spec(jobs.DEFAULT_CONFIG, overrides))
    options = job.options.model_copy(update={"batched": False})  # one by one, as the nodes
    reference = simulate(Dropping(job.algorithm, drops), job.clients, job.rounds, job.seed, progress=False,
                         options=options)
    job.finish(reference).save(root / "poisoned-simulated")
    assert_equal_tensors(saved_tensors(out), saved_tensors(root / "poisoned-simulated"), "fedavg-lora")
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
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(APP_TOML.replace('clientapp = "collabalign.app:client_app"',
                                                            'clientapp = "poison:client_app"'))
    (folder / "poison.py").write_text(POISON)
    return folder
