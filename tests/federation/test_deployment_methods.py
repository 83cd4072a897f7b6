"""FSLoRA, FIRM and federated AffPCL (on two agents' arrays) on a real Flower deployment on the loopback (TLS, SuperNode
authentication, a node worker and a private-state folder per SuperNode, `flwr run` of the app folder that `collabalign
deploy` writes: the installed package's apps, no project files to pack): what they save equals, bit for bit, what the
in-process simulator saves on the same job with the clients trained one after another (the same arithmetic on one
thread): adapters, arrays, and the personal models AffPCL's nodes keep. Each FSLoRA device's rank is the one its
SuperNode declares in its node config, not the config's; AffPCL's uploads are quantised to 8 bits (the same stochastic
rounding on the nodes as in the simulator). While the jobs run, the SuperLink refuses three SuperNodes: one whose key
was never registered, one without the CA certificate the SuperLink's certificate is signed by, and one that talks
plaintext; each gives up after its retries and is never listed online. A file apart from test_deployment.py, so the two
run side by side under pytest-xdist."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.cli import CONFIG_DIR
from collabalign.deployment import write_app
from collabalign.examples import agent_arrays
from collabalign.federation.deploy import CONNECTION, HOST, LoopbackDeployment, free_port, write_node_key

pytestmark = pytest.mark.flower

DECLARED = {0: {"rank": 4}, 1: {"rank": 2}}  # the SuperNodes' node configs; the config says ranks [2, 4]
SMALL = {  # each method's deployment config on the tiny Llama, two clients
    "fslora": ["model=tiny-llama", "ranks=[2, 4]", "lora.rank=4", "rounds=1", "max_length=24"],
    "firm": ["model=tiny-llama", "clients=2", "rounds=1", "max_new_tokens=4", "lora.blocks=1"],
}


def saved_tensors(*folders: Path) -> dict[str, np.ndarray]:
    """Every adapter tensor and saved array under `folders` (run folders, nodes' saved results)."""
    out = {}
    for folder in folders:
        for p in sorted(folder.glob("**/adapters/*/*.safetensors")):
            out |= {f"{p.parent.name}/{p.name}/{k}": v for k, v in load_file(str(p)).items()}
        for p in sorted(folder.glob("**/arrays.safetensors")):
            out |= {f"arrays/{k}": v for k, v in load_file(str(p)).items()}
    return out


def test_every_method_on_the_deployment_equals_the_simulator(tmp_path):
    np.savez(tmp_path / "agents.npz", **agent_arrays(agents=2))
    small = {**SMALL, "affpcl-federated": [f"data={tmp_path / 'agents.npz'}", "steps=2", "eval_every=2",
                                           "engine.min_replies=2", "engine.upload_bits=8"]}  # quantised uploads
    with LoopbackDeployment(tmp_path, env={"OMP_NUM_THREADS": "1"}, state_dir=tmp_path / "state",
                            workers=True) as deployment:
        deployment.node_settings = DECLARED
        deployment.start(nodes=2)
        deployment.wait_status([0, 1], "online")
        refused = start_refused_nodes(deployment, tmp_path)
        app = write_app(tmp_path / "app")
        for method, overrides in small.items():
            config = CONFIG_DIR / "deploy" / f"{method}.yaml"
            run = deployment.run(app, {"config": str(config), "overrides": "; ".join(overrides),
                                        "out": str(tmp_path / method)}, name=method)
            assert run.wait(timeout=600) == 0, deployment.log(method)
            simulated_as = overrides + (["ranks=[4, 2]"] if method == "fslora" else [])  # as the nodes declared
            job = jobs.build(jobs.read_spec(config, simulated_as))
            job.options = job.options.model_copy(update={"batched": False})  # one by one, as the nodes
            job.run().save(tmp_path / f"{method}-simulated")
            on_nodes = (tmp_path / "state").glob(f"node*/{jobs.job_key(jobs.read_spec(config, overrides))}/*/result")
            deployed = saved_tensors(tmp_path / method, *on_nodes)
            simulated = saved_tensors(tmp_path / f"{method}-simulated")
            assert sorted(deployed) == sorted(simulated) and simulated, method
            for key, value in simulated.items():
                np.testing.assert_array_equal(deployed[key], value, err_msg=f"{method} {key}")
        assert json.loads((tmp_path / "fslora" / "manifest.json").read_text())["metrics"]["ranks"] == [4, 2]

        assert_refused(deployment, refused, tmp_path)


def start_refused_nodes(deployment: LoopbackDeployment, tmp_path: Path) -> dict:
    """Three SuperNodes the SuperLink must refuse, started beside the registered ones."""
    stranger, _ = write_node_key(tmp_path / "keys", "stranger")  # never registered
    no_ca, public = write_node_key(tmp_path / "keys", "no-ca")  # a registered key: only TLS stands in its way
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


def assert_refused(deployment: LoopbackDeployment, processes: dict, tmp_path: Path) -> None:
    """Each refused SuperNode gave up with an error for its own reason; only the two registered ones are online."""
    deadline = time.monotonic() + 120
    while any(p.poll() is None for p in processes.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    outcome = {name: p.poll() for name, p in processes.items()}
    for p in processes.values():
        if p.poll() is None:
            p.kill()
    assert all(code not in (None, 0) for code in outcome.values()), outcome  # each gave up with an error
    logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace") for name in processes}
    assert "Failed to activate SuperNode" in logs["unregistered"]  # reached the SuperLink, which refused its key
    assert "certificate verify failed" in logs["no-ca"]  # could not trust the SuperLink's certificate
    assert "Connection attempt failed" in logs["plaintext"] and "Failed to activate" not in logs["plaintext"]
    nodes = deployment.flwr("supernode", "ls", "loopback", "--format", "json")
    assert nodes.count('"online"') == 2  # only the registered nodes with the CA and TLS
