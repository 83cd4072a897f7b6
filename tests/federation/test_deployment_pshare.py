"""Federated P-ShareLoRA on a real Flower deployment on the loopback (TLS, SuperNode authentication, a node worker and
a private-state folder per SuperNode), stopped mid-run and resumed: once round 1 is recorded, SuperNode 1 is killed
(SIGKILL) and then the whole deployment (SuperLink, ServerApp, the other SuperNodes) is stopped. A fresh deployment
with the same state folders and run folder continues from the ServerApp's last checkpoint and the nodes' saved
private state. Each user's personal factors never reach the server; each node saves its user's reward model, and
every one equals, byte for byte, the in-process simulator's for the same job run without any kill. A file of its
own, so it runs beside the other deployment tests under pytest-xdist."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from collabalign import jobs
from collabalign.cli import CONFIG_DIR
from collabalign.deployment import write_app
from collabalign.federation.deploy import LoopbackDeployment

pytestmark = pytest.mark.flower

CONFIG = CONFIG_DIR / "deploy" / "pshare-lora-federated.yaml"
TINY = ["model=tiny-llama", "lora.blocks=1", "rounds=2", "max_length=32", "engine.timeout_s=120"]
KILLED, STOP_AFTER = 1, 1  # SuperNode 1 is killed, and the deployment stopped, once round 1 is recorded


def recorded_rounds(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [json.loads(line)["round"] for line in path.read_text().splitlines()] if path.exists() else []


def tensors(folder: Path) -> dict[str, np.ndarray]:
    return {f"{p.parent.name}/{p.name}/{k}": v for p in sorted(folder.glob("adapters/*/*.safetensors"))
            for k, v in load_file(str(p)).items()}


def test_a_killed_node_and_a_stopped_server_resume_to_the_simulators_personal_models(tmp_path):
    run_config = {"config": str(CONFIG), "overrides": "; ".join(TINY), "out": str(tmp_path / "out")}
    state, env = tmp_path / "state", {"OMP_NUM_THREADS": "1"}
    app = write_app(tmp_path / "app")  # what `collabalign deploy` runs: the installed apps, no project files to pack
    with LoopbackDeployment(tmp_path / "first", env=env, state_dir=state, workers=True) as deployment:
        deployment.start(nodes=3)
        run = deployment.run(app, run_config)
        deadline = time.monotonic() + 300
        while STOP_AFTER not in recorded_rounds(tmp_path / "out"):
            assert run.poll() is None and time.monotonic() < deadline, deployment.log("run")
            time.sleep(0.1)
        deployment.kill_node(KILLED)
    # stopped: the SuperLink with the ServerApp it ran, every SuperNode and worker
    assert max(recorded_rounds(tmp_path / "out")) < 2

    with LoopbackDeployment(tmp_path / "second", env=env, state_dir=state, workers=True) as deployment:
        deployment.start(nodes=3)
        run = deployment.run(app, run_config)
        assert run.wait(timeout=600) == 0, deployment.log("run")
    assert recorded_rounds(tmp_path / "out") == [0, 1, 2]  # each round once: continued, not started over

    job = jobs.build(jobs.read_spec(CONFIG, TINY))
    simulated = job.run()
    simulated.save(tmp_path / "simulated")
    expected = tensors(tmp_path / "simulated")
    saved_on_nodes = {}
    for partition in range(3):
        results = list((state / f"node{partition}").glob("*/user*/result"))
        assert len(results) == 1, results
        saved_on_nodes |= tensors(results[0])
    assert sorted(saved_on_nodes) == sorted(expected) and len({k.split("/")[0] for k in expected}) == 3
    for key, value in expected.items():
        np.testing.assert_array_equal(saved_on_nodes[key], value, err_msg=key)

    # the server never held a personal factor: its result is the shared B and score head only
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    shared = load_file(str(tmp_path / "out" / "arrays.safetensors"))
    assert manifest["adapters"] == [] and shared and all(k.endswith(".B") or "head" in k for k in shared)
    final = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["accuracy"] == simulated.metrics["accuracy"]
